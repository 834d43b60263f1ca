"""A state machine's definition is parsed once, not at every execution.

moto 5.2.5 runs executions with the ASL interpreter it takes from LocalStack: each execution parses the definition
again with ANTLR's Python runtime (about half a second of CPU for template.yaml's state machine) before it turns
the parse tree into the components it evaluates. The parse tree depends on the definition's text alone and is only
read afterwards, so the twin keeps the trees of the last few definitions and builds each execution's components
anew from its definition's tree: every execution still gets components of its own (they hold an execution's
state, such as a retrier's count of attempts), and a definition that does not parse is refused as before (it is
parsed the first time by moto's own parser and never kept).

The JSONPaths of a state (InputPath, OutputPath, ResultPath, a parameter's `.$`) are parsed once per text too:
jsonpath_ng builds a new parser, with its grammar's tables, for every path it parses, and the interpreter parsed each
path at each evaluation, about a fortieth of the twin's CPU. A parsed path is only read when it is applied.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

from moto.stepfunctions.parser.asl.component.common.path import result_path
from moto.stepfunctions.parser.asl.parse import asl_parser
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.asl.utils import json_path

_PATCHED = "_lustrain_twin_parsed_once"
#: definitions whose parse trees are kept (a twin's stack has one state machine; tests make a few more)
KEPT = 16
#: JSONPaths kept parsed (template.yaml's state machine has about a hundred)
PATHS_KEPT = 1024

_lock = threading.Lock()
_trees: OrderedDict[str, Any] = OrderedDict()


def parse(definition: str, original: Any) -> tuple[Any, Any]:
    """The components of one execution of `definition`, and its parse tree."""
    with _lock:
        tree = _trees.get(definition)
        if tree is not None:
            _trees.move_to_end(definition)
    if tree is None:
        program, tree = original(definition)
        with _lock:
            _trees[definition] = tree
            while len(_trees) > KEPT:
                _trees.popitem(last=False)
        return program, tree
    return Preprocessor().visit(tree), tree


def install() -> None:
    _install_paths_parsed_once()
    parser = asl_parser.AmazonStateLanguageParser
    if getattr(parser, _PATCHED, False):
        return
    original = parser.parse

    def parse_once(definition: str) -> tuple[Any, Any]:
        return parse(definition, original)

    parser.parse = staticmethod(parse_once)  # type: ignore[method-assign]
    setattr(parser, _PATCHED, True)


def _install_paths_parsed_once() -> None:
    for module in (json_path, result_path):
        if not getattr(module.parse, _PATCHED, False):
            cached = functools.lru_cache(maxsize=PATHS_KEPT)(module.parse)
            setattr(cached, _PATCHED, True)
            module.parse = cached  # type: ignore[attr-defined]
