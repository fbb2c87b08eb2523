"""Bounded, strict YAML for scenario files: safe types only, duplicate keys rejected, and alias/merge
expansion measured on the node graph (memoised, linear in the text) before any Python object is built."""
from __future__ import annotations

import yaml
from yaml.constructor import ConstructorError

MAX_NODES = 200_000     # expanded node count; the largest committed scenario has a few hundred


class TooLarge(yaml.YAMLError):
    def __init__(self, nodes: int):
        self.problem_mark = None
        self.problem = (f"expands to more than {MAX_NODES} nodes through aliases/merge keys ({nodes}+ counted); "
                        "write the values out or use a sweep")
        super().__init__(self.problem)


def expanded_size(node: yaml.Node, limit: int = MAX_NODES) -> int:
    """Nodes the document would have if every alias were copied; stops counting past `limit`."""
    memo: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        if id(n) in memo:
            return memo[id(n)]
        memo[id(n)] = limit + 1          # a cycle counts as unbounded
        if isinstance(n, yaml.SequenceNode):
            total = 1 + sum(size(c) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in n.value)
        else:
            total = 1
        memo[id(n)] = min(total, limit + 1)
        return memo[id(n)]

    return size(node)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and documents too large once aliases are expanded."""

    def construct_document(self, node):
        nodes = expanded_size(node)
        if nodes > MAX_NODES:
            raise TooLarge(nodes)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue                       # merged keys may be overridden: that is what << is for
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue                       # unhashable keys fail in the base class with a message
                if duplicate:
                    raise ConstructorError("while constructing a mapping", node.start_mark,
                                           f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load(text: str):
    """Parse one YAML document; raises yaml.YAMLError (with problem/problem_mark when known)."""
    return yaml.load(text, Loader=StrictLoader)   # noqa: S506 - StrictLoader is a SafeLoader
