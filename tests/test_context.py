"""RuntimeContext and its binding: who is asking, and where that identity is visible."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError

from llama_jev.core.context import (
    RuntimeContext,
    current_runtime_context,
    resolve_runtime_context,
    runtime_context,
)
from llama_jev.core.errors import MissingRuntimeContextError

# --- the model ---------------------------------------------------------------------------------


def test_roles_accept_any_iterable_of_strings_and_become_a_frozenset() -> None:
    ctx = RuntimeContext(user_id="u1", roles=["support", "billing"])
    assert ctx.roles == frozenset({"support", "billing"})
    assert isinstance(ctx.roles, frozenset)


def test_defaults_are_empty_and_absent() -> None:
    ctx = RuntimeContext(user_id="u1")
    assert ctx.session_id is None
    assert ctx.tenant_id is None
    assert ctx.roles == frozenset()
    assert dict(ctx.attributes) == {}


@pytest.mark.parametrize("user_id", ["", " ", "\t\n"])
def test_blank_user_id_is_rejected(user_id: str) -> None:
    with pytest.raises(ValidationError, match="user_id must not be blank"):
        RuntimeContext(user_id=user_id)


def test_user_id_is_required() -> None:
    with pytest.raises(ValidationError, match="user_id"):
        RuntimeContext()  # type: ignore[call-arg]


def test_non_string_user_id_is_not_coerced() -> None:
    with pytest.raises(ValidationError):
        RuntimeContext(user_id=42)  # type: ignore[arg-type]


@pytest.mark.parametrize("roles", [{""}, {"ok", "  "}])
def test_blank_role_is_rejected(roles: set[str]) -> None:
    with pytest.raises(ValidationError, match="role must not be blank"):
        RuntimeContext(user_id="u1", roles=roles)


def test_a_single_string_is_not_taken_as_a_set_of_roles() -> None:
    # "admin" must not silently become {"a", "d", "m", "i", "n"}.
    with pytest.raises(ValidationError):
        RuntimeContext(user_id="u1", roles="admin")


@pytest.mark.parametrize("field", ["tenant_id", "session_id"])
def test_blank_optional_ids_are_rejected_rather_than_read_as_values(field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field} must not be blank"):
        RuntimeContext.model_validate({"user_id": "u1", field: " "})


def test_extra_fields_are_forbidden() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RuntimeContext(user_id="u1", is_admin=True)  # type: ignore[call-arg]


def test_attribute_values_must_be_strings() -> None:
    with pytest.raises(ValidationError):
        RuntimeContext(user_id="u1", attributes={"level": 3})  # type: ignore[dict-item]


def test_context_fields_cannot_be_reassigned() -> None:
    ctx = RuntimeContext(user_id="u1", tenant_id="acme")
    with pytest.raises(ValidationError, match="frozen"):
        ctx.user_id = "u2"  # type: ignore[misc]
    assert ctx.user_id == "u1"


def test_attributes_cannot_be_mutated_through_the_mapping() -> None:
    ctx = RuntimeContext(user_id="u1", attributes={"team": "billing"})
    with pytest.raises(TypeError):
        ctx.attributes["team"] = "other"  # type: ignore[index]
    assert not hasattr(ctx.attributes, "update")
    assert ctx.attributes["team"] == "billing"


def test_attributes_do_not_follow_later_changes_to_the_source_dict() -> None:
    source = {"team": "billing"}
    ctx = RuntimeContext(user_id="u1", attributes=source)
    source["team"] = "other"
    assert ctx.attributes["team"] == "billing"


def test_context_is_hashable_and_compares_by_value() -> None:
    a = RuntimeContext(user_id="u1", roles={"r"}, attributes={"k": "v"})
    b = RuntimeContext(user_id="u1", roles={"r"}, attributes={"k": "v"})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_context_round_trips_through_json() -> None:
    ctx = RuntimeContext(user_id="u1", session_id="s", tenant_id="acme", roles={"r"}, attributes={"k": "v"})
    assert RuntimeContext.model_validate_json(ctx.model_dump_json()) == ctx
    assert ctx.model_dump()["attributes"] == {"k": "v"}


# --- binding -----------------------------------------------------------------------------------


def test_bound_context_is_current_inside_the_block_only() -> None:
    ctx = RuntimeContext(user_id="u1")
    with runtime_context(ctx) as bound:
        assert bound is ctx
        assert current_runtime_context() is ctx
    with pytest.raises(MissingRuntimeContextError):
        current_runtime_context()


def test_nothing_bound_raises_with_instructions() -> None:
    with pytest.raises(MissingRuntimeContextError, match=r"with runtime_context\(RuntimeContext\(user_id=\.\.\.\)\)"):
        current_runtime_context()


def test_missing_context_error_is_a_lookup_error() -> None:
    with pytest.raises(LookupError):
        current_runtime_context()


def test_nested_binding_restores_the_outer_one() -> None:
    outer = RuntimeContext(user_id="outer")
    inner = RuntimeContext(user_id="inner")
    with runtime_context(outer):
        with runtime_context(inner):
            assert current_runtime_context() is inner
        assert current_runtime_context() is outer


def test_binding_is_restored_when_the_block_raises() -> None:
    outer = RuntimeContext(user_id="outer")
    with runtime_context(outer):
        with pytest.raises(RuntimeError), runtime_context(RuntimeContext(user_id="inner")):
            raise RuntimeError("boom")
        assert current_runtime_context() is outer


@pytest.mark.parametrize("not_a_context", [None, "u1", {"user_id": "u1"}])
def test_runtime_context_rejects_anything_but_a_runtime_context_at_call_time(not_a_context: object) -> None:
    # Raised by the call itself, before any `with`: a wrong argument never half-binds.
    with pytest.raises(TypeError, match="RuntimeContext"):
        runtime_context(not_a_context)  # type: ignore[arg-type]


def test_resolve_prefers_the_explicit_context() -> None:
    explicit = RuntimeContext(user_id="explicit")
    with runtime_context(RuntimeContext(user_id="bound")):
        assert resolve_runtime_context(explicit) is explicit


def test_resolve_falls_back_to_the_bound_context() -> None:
    bound = RuntimeContext(user_id="bound")
    with runtime_context(bound):
        assert resolve_runtime_context(None) is bound


def test_resolve_without_any_context_raises() -> None:
    with pytest.raises(MissingRuntimeContextError):
        resolve_runtime_context(None)


def test_resolve_rejects_a_non_context() -> None:
    with pytest.raises(TypeError, match="RuntimeContext"):
        resolve_runtime_context("u1")  # type: ignore[arg-type]


# --- asyncio and threads -----------------------------------------------------------------------


async def test_concurrent_tasks_each_see_their_own_binding() -> None:
    rng = random.Random(7)
    delays = [rng.random() / 100 for _ in range(50)]

    async def work(i: int) -> tuple[str, str]:
        with runtime_context(RuntimeContext(user_id=f"user-{i}")):
            seen_before = current_runtime_context().user_id
            await asyncio.sleep(delays[i])  # interleave with the other 49 tasks
            await asyncio.sleep(0)
            return seen_before, current_runtime_context().user_id

    results = await asyncio.gather(*(work(i) for i in range(50)))
    assert results == [(f"user-{i}", f"user-{i}") for i in range(50)]
    with pytest.raises(MissingRuntimeContextError):
        current_runtime_context()  # no task's binding leaked into the caller


async def test_tasks_created_inside_a_binding_inherit_it() -> None:
    ctx = RuntimeContext(user_id="u1")

    async def read() -> RuntimeContext:
        return current_runtime_context()

    with runtime_context(ctx):
        assert await asyncio.create_task(read()) is ctx


def test_thread_pool_with_copied_context_sees_the_binding() -> None:
    ctx = RuntimeContext(user_id="u1")
    with runtime_context(ctx), ThreadPoolExecutor(max_workers=2) as pool:
        seen = pool.submit(contextvars.copy_context().run, current_runtime_context).result()
    assert seen is ctx


def test_plain_new_thread_does_not_see_the_binding() -> None:
    # Documented: a thread started without a context copy starts empty, never with an identity.
    outcome: list[BaseException | RuntimeContext] = []

    def read() -> None:
        try:
            outcome.append(current_runtime_context())
        except MissingRuntimeContextError as exc:
            outcome.append(exc)

    with runtime_context(RuntimeContext(user_id="u1")):
        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
    assert len(outcome) == 1
    assert isinstance(outcome[0], MissingRuntimeContextError)
