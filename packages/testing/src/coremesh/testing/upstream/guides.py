"""JAX's TPU guides: where they are in a tree, the slice each was written on, and what changes.

Each guide runs as written, on the chip and device count its text names, with two kinds of
declared text changes and nothing else:

* a device gate: ``assert "TPU" in jax.devices()[0].device_kind`` reads a host CPU device under
  the simulator, so it is asked of the simulated chip's device kind (as the test shims'
  ``is_device_tpu`` does);
* a jax spelling: the guide uses an API that jax has since renamed or changed, so the cell fails
  on every backend with the jax lines coremesh supports (each was checked without the simulator,
  on plain CPU devices). The new spelling is what the guide's code meant when it was run.

Every change a cell got is reported with it; ``--as-written`` runs the guides unchanged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from coremesh.core import jax_versions
from coremesh.core.errors import CoremeshError
from coremesh.testing.upstream.tree import TestTree

#: Where the guides sit inside a tree.
GUIDES_DIR = Path("docs", "pallas", "tpu")


@dataclasses.dataclass(frozen=True)
class Change:
    """Replace ``old`` by ``new`` in any cell that holds it (``{device_kind}``: the simulated
    chip's)."""

    old: str
    new: str
    why: str
    #: The first jax release the change is for (None: every supported one).
    since: str | None = None


@dataclasses.dataclass(frozen=True)
class Guide:
    name: str
    chip: str
    devices: int
    #: Where the guide says what it runs on.
    why: str
    changes: tuple[Change, ...] = ()

    def path(self, tree: TestTree) -> Path:
        return tree.root / GUIDES_DIR / f"{self.name}.md"


_MESH_CORES = Change(
    "len(tc_mesh.devices)",
    "tc_mesh.num_cores",
    "jax spelling: from jax 0.11 a TensorCoreMesh has num_cores and no devices "
    "(AttributeError on every backend)",
    since="0.11",
)
_MESH_FACTORY = Change(
    "pltpu.create_tensorcore_mesh('core')",
    "pltpu.TensorCoreMesh(axis_name='core')",
    "jax spelling: jax 0.12.1 removed pltpu.create_tensorcore_mesh (deprecated since 0.11 for "
    "the TensorCoreMesh class)",
    since="0.12.1",
)
_DEVICE_GATE = Change(
    'assert "TPU" in jax.devices()[0].device_kind',
    'assert "TPU" in {device_kind!r}',
    "device gate: asked of the simulated chip, not the host CPU device",
)
_MEMORY_SPACE = Change(
    "pltpu.TPUMemorySpace.",
    "pltpu.MemorySpace.",
    "jax spelling: pltpu.TPUMemorySpace is gone (AttributeError on jax 0.10.2 and later); "
    "pltpu.MemorySpace is its name now",
)
_AUTO_MESH = Change(
    "jax.make_mesh((num_devices,), ('x',))",
    "jax.make_mesh((num_devices,), ('x',), axis_types=(jax.sharding.AxisType.Auto,))",
    "jax spelling: the guide was run when make_mesh made Auto axes; it makes Explicit ones now, "
    "and the cells' strided prints (input_arr[0, ::128]) raise ShardingTypeError on every backend",
)

GUIDES: tuple[Guide, ...] = (
    Guide(
        "core_map",
        "v5p",
        4,
        "'written on a v5p chip, which contains 4 devices'",
        (_MESH_FACTORY, _MESH_CORES),
    ),
    Guide(
        "distributed",
        "v4",
        4,
        "asserts more than one device; its examples are 4-device rings; its notebook's recorded "
        "output is 'Running with 4 TPU v4 devices'",
        (_DEVICE_GATE, _MEMORY_SPACE, _AUTO_MESH),
    ),
    Guide(
        "sparsecore",
        "TPU7x",
        1,
        "asserts a SparseCore; its recorded output is 'SparseCore info for TPU 7x'; one device",
    ),
)

NAMES = tuple(g.name for g in GUIDES)


def get_guide(name: str) -> Guide:
    for g in GUIDES:
        if g.name == name.removesuffix(".md"):
            return g
    raise CoremeshError(
        f"no TPU guide named {name!r}",
        fix=f"use one of {', '.join(NAMES)}",
    )


def apply_changes(
    source: str, guide: Guide, device_kind: str, jax_version: str | None = None
) -> tuple[str, tuple[str, ...]]:
    """``source`` with the guide's changes for ``jax_version`` (the installed one if None)
    made, and why each one that applied was made."""
    found = jax_versions.installed() if jax_version is None else jax_version
    applied: list[str] = []
    for c in guide.changes:
        if c.since is not None and jax_versions.parse(found) < jax_versions.parse(c.since):
            continue
        if c.old in source:
            source = source.replace(c.old, c.new.format(device_kind=device_kind))
            applied.append(c.why)
    return source, tuple(applied)
