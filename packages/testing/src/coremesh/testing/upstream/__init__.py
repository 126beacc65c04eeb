"""JAX's own Pallas TPU tests, run as a new user would: on the simulator and in stock interpret
mode.

``coremesh upstream --jax-tests PATH`` (or ``nox -s upstream``) runs each test file of a JAX test
tree in a child pytest, with the tests' device gates answering for the simulated chip each test
needs and nothing in a test body changed, and writes a per-file table. Modules:

* :mod:`~coremesh.testing.upstream.tree`: test trees, and which one each jax line runs;
* :mod:`~coremesh.testing.upstream.needs`: the chip and device count each test class needs;
* :mod:`~coremesh.testing.upstream.imports`: the tree's ``jax/_src`` helpers, never shadowing jax;
* :mod:`~coremesh.testing.upstream.gates`: the device gates, answering for the simulated chip;
* :mod:`~coremesh.testing.upstream.shims`: the child's pytest plugin;
* :mod:`~coremesh.testing.upstream.events`: what a child reports, as it happens;
* :mod:`~coremesh.testing.upstream.run`: one child per file and mode, a watchdog per test;
* :mod:`~coremesh.testing.upstream.report`: the tables (markdown + JSON);
* :mod:`~coremesh.testing.upstream.subset`: the fixed subset CI runs, which must pass;
* :mod:`~coremesh.testing.upstream.command`: the ``coremesh upstream`` command.

``coremesh upstream --guides`` runs the tree's TPU guides (``docs/pallas/tpu``) instead, cell by
cell, on the slice each was written on:

* :mod:`~coremesh.testing.upstream.guides`: the guides, their slices and declared text changes;
* :mod:`~coremesh.testing.upstream.guide_cells`: a guide's code cells, as a notebook runs them;
* :mod:`~coremesh.testing.upstream.guide_child`: the child that runs one guide's cells;
* :mod:`~coremesh.testing.upstream.guide_checks`: printed differences and recorded outputs;
* :mod:`~coremesh.testing.upstream.guide_run`: one child per guide, a watchdog per cell;
* :mod:`~coremesh.testing.upstream.guide_report`: the per-cell tables (markdown + JSON).
"""
