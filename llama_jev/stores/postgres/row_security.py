"""PostgreSQL row-level security as a floor under the ACL filter of ``AclPGVectorStore``.

The filter the store writes into each query keeps a caller inside what the ACL allows, but only
on the queries that carry it. Row-level security keeps the tenant in the database itself: a
policy on the table admits a row only when its tenant equals a per-transaction setting
(:data:`TENANT_SETTING`), which ``AclPGVectorStore(..., row_security=True)`` sets at the start of
every transaction it opens, to the tenant of the query's caller. A query that bypasses the
app's filter (a plain ``PGVectorStore``, a raw ``SELECT``, a bug) still reads that tenant's rows
only, as the application role; without the setting it reads no rows at all.

Two parts, both here:

- :func:`row_security_ddl`: the statements the table's owner runs once (enable row-level
  security, the policy, the grants of the application role);
- :class:`RowSecurity`: how one store learns its caller's tenant per query (:meth:`RowSecurity.scope`,
  around each query) and sets it in each transaction (a ``begin`` listener on the store's
  engines). The tenant is held in a ``ContextVar``, so it follows the query's asyncio tasks and
  SQLAlchemy's async greenlets and never outlives the query.

Needs SQLAlchemy only (it ships with ``llama-index-core``), not the ``postgres`` extra.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import sqlalchemy
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import TEXT

from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.context import current_runtime_context
from llama_jev.core.errors import MissingRuntimeContextError
from llama_jev.stores.postgres.sql import AclFilters

__all__ = ["POLICY", "TENANT_SETTING", "RowSecurity", "query_tenant", "row_security_ddl"]

logger = logging.getLogger("llama_jev")

TENANT_SETTING = "llama_jev.tenant"
"""The per-transaction setting the policy reads (``current_setting('llama_jev.tenant', true)``)."""

POLICY = "llama_jev_tenant"
"""The policy's name on the table (one per table; :func:`row_security_ddl` replaces it)."""

# What jsonb_typeof returns besides 'string' (and NULL for an absent key, which NOT IN excludes too).
_OTHER_JSON_TYPES = "'number', 'boolean', 'array', 'object', 'null'"

# The tenant of the query running in this context: None outside a query, or for a caller without one.
_TENANT: ContextVar[str | None] = ContextVar("llama_jev_row_security_tenant", default=None)


def _identifier(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ValueError(f"row_security_ddl: {what} must be a non-empty name without NUL characters")
    preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
    return str(preparer.quote(value))


def _text_literal(value: str) -> str:
    """``value`` as an SQL string literal read the same under any ``standard_conforming_strings``."""
    if "\x00" in value:
        raise ValueError("row_security_ddl: the ACL's tenant_key holds a NUL character, which PostgreSQL text cannot")
    if "\\" in value:
        # An escape string: backslashes and quotes escaped, whatever the server's settings.
        return "E'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "'" + value.replace("'", "''") + "'"


def row_security_ddl(
    acl: MetadataAcl, table: str, *, schema: str = "public", role: str | None = None, force: bool = False
) -> list[str]:
    """The statements that put a tenant floor under ``table``: run them once, as its owner, in one transaction.

    1. ``ALTER TABLE ... ENABLE ROW LEVEL SECURITY`` (and ``FORCE ROW LEVEL SECURITY`` with
       ``force=True``);
    2. ``DROP POLICY IF EXISTS`` then ``CREATE POLICY llama_jev_tenant ... FOR SELECT TO <role>
       USING (...)``: a row is visible when its ``acl.tenant_key`` holds a JSON string equal to
       ``current_setting('llama_jev.tenant', true)``; an unset or empty setting admits no row;
    3. with ``role``: ``GRANT USAGE`` on the schema and ``GRANT SELECT`` on the table to it.

    Idempotent: run again (in one transaction, so no query sees the table between the drop and
    the create), it replaces the policy with the same one. ``table`` is the table's name in the
    database: LlamaIndex names it ``data_<table_name>`` (``store.row_security_ddl(acl)`` fills
    it in). Names are quoted as identifiers and the tenant key as a string literal, never pasted.

    Who the policy binds (PostgreSQL's rules, not ours):

    - superusers and roles with ``BYPASSRLS`` always bypass it;
    - the table's owner bypasses it unless ``force=True`` (``FORCE ROW LEVEL SECURITY``);
    - so the application reads as a role of its own that owns nothing (``role``), with
      ``SELECT`` only. The policy covers reads (``FOR SELECT``): ingestion, deletes and re-tags
      run as the owner (with ``force=True`` the owner's writes need policies of their own, or a
      ``BYPASSRLS`` role).

    Raises:
        TypeError: ``acl`` is not a ``MetadataAcl``.
        ValueError: the ACL checks no tenant, or a name is empty or holds a NUL character.

    Example::

        for statement in row_security_ddl(acl, "data_docs", role="rag_app"):
            print(statement + ";")
    """
    if not isinstance(acl, MetadataAcl):
        raise TypeError(f"row_security_ddl: acl must be a MetadataAcl, not {type(acl).__name__}")
    if acl.tenant_key is None:
        raise ValueError(
            "row_security_ddl: the policy keeps each caller inside its tenant, and this MetadataAcl checks no "
            "tenant: build it with tenant_key=..."
        )
    qualified = f"{_identifier(schema, 'schema')}.{_identifier(table, 'table')}"
    grantee = "PUBLIC" if role is None else _identifier(role, "role")
    key = _text_literal(acl.tenant_key)
    setting = f"NULLIF(current_setting('{TENANT_SETTING}', true), '')"
    # ->> is the expression the tenant index of acl_index_ddl is built on; the type check keeps
    # a number, list or object whose text happens to equal the setting out, as MetadataAcl does.
    # It names the five other JSON types rather than "= 'string'": the planner estimates a
    # function's "= constant" at 0.5 % of the rows, and with that (and the store's own tenant
    # check counted again) it took a 25 % tenant for 16 rows and read all 25,000 of them through
    # the tenant index instead of walking HNSW (450 ms instead of 3 ms; NOT IN is estimated at 97.5 %).
    kind = f"jsonb_typeof(CAST(metadata_ -> {key} AS jsonb))"
    using = f"(metadata_ ->> {key}) = {setting} AND {kind} NOT IN ({_OTHER_JSON_TYPES})"
    statements = [f"ALTER TABLE {qualified} ENABLE ROW LEVEL SECURITY"]
    if force:
        statements.append(f"ALTER TABLE {qualified} FORCE ROW LEVEL SECURITY")
    statements += [
        f"DROP POLICY IF EXISTS {POLICY} ON {qualified}",
        f"CREATE POLICY {POLICY} ON {qualified} AS PERMISSIVE FOR SELECT TO {grantee} USING ({using})",
    ]
    if role is not None:
        statements += [
            f"GRANT USAGE ON SCHEMA {_identifier(schema, 'schema')} TO {grantee}",
            f"GRANT SELECT ON {qualified} TO {grantee}",
        ]
    return statements


def _carried(filters: Any) -> Iterator[AclFilters]:
    if isinstance(filters, AclFilters):
        yield filters
        return
    for part in getattr(filters, "filters", None) or ():
        yield from _carried(part)


def query_tenant(filters: Any) -> str | None:
    """The tenant a query acts for: its ``AclFilters``' caller's, else the bound ``RuntimeContext``'s.

    ``None`` when neither names one (no caller, or a caller without a tenant): the policy then
    admits no row.

    Raises:
        ValueError: the query carries callers of different tenants, or another tenant than the
            bound ``RuntimeContext`` (one query acts for one caller).

    Example::

        query_tenant(acl_filters(acl, RuntimeContext(user_id="u1", tenant_id="acme")))  # 'acme'
    """
    carried = {restriction.ctx.tenant_id for restriction in _carried(filters)}
    try:
        bound: str | None = current_runtime_context().tenant_id
        is_bound = True
    except MissingRuntimeContextError:
        bound, is_bound = None, False
    if not carried:
        return bound
    if len(carried) > 1 or (is_bound and carried != {bound}):
        # No tenant values in the message: they are identity values.
        raise ValueError(
            "AclPGVectorStore(row_security=True): one query acts for callers of different tenants (its AclFilters, "
            "or its AclFilters and the bound RuntimeContext). Query once per caller, inside that caller's "
            "runtime_context(...)."
        )
    return next(iter(carried))


def _set_tenant(connection: sqlalchemy.Connection) -> None:
    # In every transaction, also outside a query (empty then): a session-level SET on a pooled
    # connection can never stand in for the caller. set_config(..., is_local => true) lasts
    # until the transaction ends, and binds the value (SET takes none).
    value = _TENANT.get() or ""
    connection.execute(
        sqlalchemy.select(
            sqlalchemy.func.set_config(
                sqlalchemy.literal(TENANT_SETTING, TEXT), sqlalchemy.literal(value, TEXT), sqlalchemy.true()
            )
        )
    )


class RowSecurity:
    """One store's side of the floor: the caller's tenant set in every transaction its engines begin.

    Example::

        row_security = RowSecurity("AclPGVectorStore")
        row_security.install(engine, async_engine.sync_engine)
        with row_security.scope(query.filters):
            ...  # every transaction begun here sets llama_jev.tenant to the caller's tenant
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._warned = threading.Event()

    def install(self, *engines: sqlalchemy.Engine) -> None:
        """Listen to each engine's ``begin`` (once per engine)."""
        for engine in engines:
            if not sqlalchemy.event.contains(engine, "begin", _set_tenant):
                sqlalchemy.event.listen(engine, "begin", _set_tenant)

    @contextmanager
    def scope(self, filters: Any, *, quiet: bool = False) -> Iterator[str | None]:
        """For the block: the tenant of :func:`query_tenant` is what each transaction sets.

        ``quiet``: no warning without a tenant (a diagnostic read, not a caller's query).
        """
        tenant = query_tenant(filters)
        if tenant is None and not quiet and not self._warned.is_set():
            self._warned.set()
            logger.warning(
                "%s(row_security=True): a query carried no caller's tenant (no AclFilters of a caller with a "
                "tenant_id, no bound RuntimeContext with one), so the database's policy admits no rows. Query "
                "through JevRetriever (pushdown on), or inside runtime_context(RuntimeContext(..., tenant_id=...)). "
                "(Said once per store.)",
                self._owner,
            )
        token = _TENANT.set(tenant)
        try:
            yield tenant
        finally:
            _TENANT.reset(token)
