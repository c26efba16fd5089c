"""``python -m examples.cerbos_permissions`` runs as the docs say: two users, two different answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .cerbos_support import require_cerbos

pytestmark = pytest.mark.slow  # starts the PDP and runs the example

REPO = Path(__file__).resolve().parents[1]


def test_the_example_shows_two_users_what_the_policy_lets_each_read_and_why() -> None:
    require_cerbos()
    done = subprocess.run(
        [sys.executable, "-m", "examples.cerbos_permissions"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Cerbos PDP ready (http://127.0.0.1:")
    assert lines[1:] == [
        "alice (tenant acme, roles support; the plan, a condition, pushed down):",
        '  acme/holidays#0: rule public: public is true or "true"',
        "  acme/refund-escalation#0: rule listed-user: the caller is in allowed_users",
        "  acme/refund-policy#0: rule listed-role: the caller's role support is in allowed_roles",
        "  acme/refund-policy#1: rule listed-role: the caller's role support is in allowed_roles",
        "bob (tenant acme, roles user (default_roles); the plan, a condition, pushed down):",
        "  acme/bob-notes#0: rule owner: the caller is the owner",
        '  acme/holidays#0: rule public: public is true or "true"',
        "bob, async: ['acme/bob-notes#0', 'acme/holidays#0']",
    ]
