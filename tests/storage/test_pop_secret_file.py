"""The POP receipt handles' secret (``<store>/pop/secret``): written once through
``storage.atomic_file.write_atomically`` with owner-only permissions, and read back,
not replaced, when the POP store opens again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from storage import MessageStore
from storage.atomic_file import write_atomically
from storage.pop import POP_DIR, PopStore


def test_the_secret_is_owner_only_and_kept_across_a_reopen(store: MessageStore) -> None:
    pop = PopStore(store, "broker-a")
    path = Path(store.config.store_dir) / POP_DIR / "secret"
    secret = path.read_bytes()
    pop.close()
    assert len(secret) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.with_suffix(".tmp").exists()
    again = PopStore(store, "broker-a")
    again.close()
    assert path.read_bytes() == secret


def test_a_short_secret_is_replaced_owner_only(store: MessageStore) -> None:
    path = Path(store.config.store_dir) / POP_DIR / "secret"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, b"short")  # the default mode: readable by others (umask)
    PopStore(store, "broker-a").close()
    assert len(path.read_bytes()) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_write_atomically_keeps_the_default_mode_less_the_umask(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "plain.json"
    write_atomically(path, "{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
