"""An app whose processors cannot boot: its child-boot hook always raises."""

from __future__ import annotations

import forkq


@forkq.on_child_boot
def connect_to_the_database() -> None:
    raise RuntimeError("database at db.invalid:5432 refused the connection")
