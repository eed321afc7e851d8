"""The ``procexec`` command table (procexec.cli.COMMAND_MODULES): real imports, so import-linter, grimp and a
reader see every command module, and none is left out."""

from __future__ import annotations

import argparse
import importlib

import grimp

from procexec.cli import COMMAND_MODULES


def test_the_command_table_imports_every_module_that_registers_commands():
    graph = grimp.build_graph("procexec", cache_dir=None)
    table = {m.__name__ for m in COMMAND_MODULES}
    assert table <= graph.find_modules_directly_imported_by("procexec.cli")
    modules = graph.find_children("procexec.cli") - {"procexec.cli.__main__"}  # __main__ runs the command
    assert table == {name for name in modules if hasattr(importlib.import_module(name), "register")}
    for module in COMMAND_MODULES:
        subparsers = argparse.ArgumentParser().add_subparsers()
        module.register(subparsers)
        assert subparsers.choices, f"{module.__name__} registers no command"
