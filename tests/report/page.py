"""A small DOM built with the standard library's HTML parser, for checking report pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

__all__ = ["Node", "parse"]

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    """One element: tag, attributes, children (elements and text)."""

    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)
    parent: Node | None = None

    def text(self) -> str:
        """The text inside, as a browser's textContent."""
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        """Every element below (depth first), self included."""
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        """Elements with a tag, a class and attribute values (``data_group`` for ``data-group``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        found = []
        for node in self.iter():
            if tag is not None and node.tag != tag:
                continue
            if cls is not None and cls not in node.attrs.get("class", "").split():
                continue
            if all(node.attrs.get(k) == v for k, v in wanted.items()):
                found.append(node)
        return found

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        """The first such element (AssertionError when none)."""
        found = self.find_all(tag, cls, **attrs)
        assert found, f"no <{tag} class={cls} {attrs}>"
        return found[0]

    def by_id(self, id_: str) -> Node:
        """The element with this id."""
        return self.find(id=id_)


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]
        self.unclosed: list[str] = []
        self.mismatched: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, parent=self.stack[-1])
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, parent=self.stack[-1])
        self.stack[-1].children.append(node)

    def handle_endtag(self, tag):
        if tag in _VOID:
            return
        if self.stack[-1].tag != tag:
            self.mismatched.append((self.stack[-1].tag, tag))
            while len(self.stack) > 1 and self.stack[-1].tag != tag:
                self.stack.pop()
        if len(self.stack) > 1:
            self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(text: str) -> Node:
    """The document; every element must be closed where it was opened (AssertionError otherwise)."""
    builder = _Builder()
    builder.feed(text)
    builder.close()
    assert not builder.mismatched, f"mismatched tags (open, close): {builder.mismatched[:5]}"
    assert len(builder.stack) == 1, f"unclosed: {[n.tag for n in builder.stack[1:]]}"
    return builder.root
