"""Penn Treebank trees for constituency parsing as sequence-to-sequence (paper, section 6.2).

Parsing is "translated" like any other task: the source is the sentence's words, the
target is the tree linearized into tokens, and a predicted target is turned back into a
tree over the source words for scoring with EVALB (:mod:`aiayn.evaluation.evalb`).

Conventions
-----------
Reading (:func:`read_trees`, :func:`parse_tree`): any bracketed text, several trees per
file, each tree over any number of lines (the ``.mrg`` format), or one tree per line.
Trees are read as they are; errors name the file and line.

Cleaning (:func:`clean_tree`), as parsing work on the WSJ does (Collins 1997 onwards):

- preterminals tagged ``-NONE-`` (traces, empty elements) are removed, and so is every
  constituent left with no words;
- function tags and indices are stripped: ``NP-SBJ-1`` -> ``NP``, ``PP-LOC=2`` -> ``PP``,
  ``S-TPC-1`` -> ``S``; labels that start with ``-`` (``-LRB-``, ``-RRB-``) are kept
  whole; an ambiguous label ``ADVP|PRT`` keeps its first alternative (``ADVP``);
- the unlabeled outer bracket of ``.mrg`` files, ``( (S ...) )``, or a ``TOP`` root, is
  removed when it holds exactly one constituent; otherwise it becomes ``TOP`` (which EVALB
  ignores), so a cleaned tree always has one labeled root;
- POS tags and words are kept (EVALB needs the gold POS tags to find punctuation);
  unary chains such as ``(NP (NP ...))`` are kept as they are.

Linearization (:func:`linearize`), as Vinyals et al. (2015) "Grammar as a Foreign
Language": an opening token ``(LABEL`` and a closing token ``)LABEL`` for every
constituent, and one placeholder ``XX`` for every word, so the target carries structure
only (no words, no POS tags)::

    (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))
    -> (S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S

Rebuilding (:func:`rebuild`) puts the input words (and POS tags if given, else ``XX``)
back at the placeholders. Model output can be malformed; it is repaired deterministically
so the result is always one tree whose leaves are exactly the input words, in order:

- a closing token closes the innermost open constituent whatever label it carries;
  a closing token with nothing open is dropped;
- an opening token without a usable label (empty, or holding a bracket), or with a
  label outside ``labels`` when that set is given, still opens a bracket (so the
  closers keep pairing up as the model meant) but the bracket is dissolved afterwards:
  its children move into its parent;
- placeholders beyond the number of words are dropped; words the output did not place
  are appended, in order, as the last children of the root;
- tokens that are none of the above (``<unk>``, a bare label) are dropped;
- brackets left open at the end are closed; constituents with no words are removed;
- if the result is not a single constituent (several top-level pieces, or only words),
  the pieces are wrapped in a ``TOP`` root, which EVALB does not count.

The treebank as the parsing task's training data (splits, parallel text, augmentation):
:mod:`aiayn.data.treebank`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.errors import DataError

logger = logging.getLogger(__name__)

PLACEHOLDER = "XX"
"""The target token standing for one word (and its POS tag), as in Vinyals et al."""

TRACE_TAG = "-NONE-"
"""POS tag of empty elements (traces, null complementizers): not words of the sentence."""

ROOT_WRAPPERS = frozenset({"", "TOP"})
"""Root labels that only wrap the real tree: the ``.mrg`` outer bracket and EVALB's TOP."""

FALLBACK_ROOT = "TOP"
"""Root label added when a tree has no single root; EVALB's COLLINS.prm deletes it."""

TARGETS = ("placeholders", "words")
"""What stands for a word in the target: ``XX`` (Vinyals et al., the paper), or the word
itself, ``(S (NP Ms. Haag )NP ... )S``: the same length, but the decoder sees which word it
has reached, so it need not count placeholders to stay aligned with the source."""


def as_placeholders(tokens: Sequence[str], placeholder: str = PLACEHOLDER) -> list[str]:
    """A target that spells its words, with each word replaced by ``placeholder``: every
    token that is not a bracket stands for a word (for :func:`rebuild`)."""
    return [t if t[:1] in "()" and len(t) > 1 else placeholder for t in tokens]


@dataclass
class Tree:
    """A constituency tree node.

    A preterminal has a POS ``label``, a ``word`` and no children; any other node has a
    phrase ``label``, ``word is None`` and at least one child in a well-formed tree.
    """

    label: str
    children: list[Tree] = field(default_factory=list)
    word: str | None = None

    @property
    def is_preterminal(self) -> bool:
        return self.word is not None

    def preterminals(self) -> list[Tree]:
        """The preterminals left to right (iterative: predicted trees may be deep)."""
        out: list[Tree] = []
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            if node.is_preterminal:
                out.append(node)
            else:
                stack.extend(reversed(node.children))
        return out

    def leaves(self) -> list[str]:
        """The words, left to right."""
        return [p.word for p in self.preterminals() if p.word is not None]

    def tags(self) -> list[str]:
        """The POS tags, left to right."""
        return [p.label for p in self.preterminals()]

    def __str__(self) -> str:
        return tree_to_string(self)


# ---------------------------------------------------------------------------------- reading
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def _tokens(text: str) -> Iterator[tuple[str, int]]:
    """Yield (token, 1-based line) for brackets and atoms."""
    # Line by line: cheaper than counting newlines before every token.
    for number, line in enumerate(text.split("\n"), start=1):
        for tok in _TOKEN.findall(line):
            yield tok, number


@dataclass
class _Frame:
    """A node being read: its label (None until read; "" for an unlabeled outer bracket)."""

    label: str | None
    line: int  # where its bracket opens
    children: list[Tree] = field(default_factory=list)
    word: str | None = None


def iter_trees(text: str, source: str = "<string>") -> Iterator[tuple[int, Tree]]:
    """Parse every bracketed tree in ``text``; yield (line where it starts, tree).

    Raises :class:`DataError` naming ``source`` and the line on unbalanced brackets,
    text outside brackets, a node with no label and no children, or words mixed with
    constituents in one node.
    """
    stack: list[_Frame] = []
    start_line = 0
    for tok, line in _tokens(text):
        if tok == "(":
            if not stack:
                start_line = line
            elif stack[-1].label is None:
                stack[-1].label = ""  # "( (S ..." : the outer bracket has no label
            stack.append(_Frame(None, line))
        elif tok == ")":
            node = _close_node(stack, source, line)
            if not stack:
                yield start_line, node
        else:
            _read_atom(stack, tok, source, line)
    if stack:
        raise DataError(f"{source}:{stack[0].line}: unbalanced brackets (tree never closed)")


def _close_node(stack: list[_Frame], source: str, line: int) -> Tree:
    """The innermost open node, closed; added to its parent's children if it has one."""
    if not stack:
        raise DataError(f"{source}:{line}: closing bracket with no open bracket")
    frame = stack.pop()
    if frame.label is None:
        raise DataError(f"{source}:{frame.line}: empty brackets '()'")
    node = Tree(frame.label, frame.children, frame.word)
    if stack:
        parent = stack[-1]
        if parent.word is not None:
            raise DataError(f"{source}:{line}: node '{parent.label}' mixes a word and constituents")
        parent.children.append(node)
    return node


def _read_atom(stack: list[_Frame], tok: str, source: str, line: int) -> None:
    """A label or a word: the first atom of a node is its label, a second one its word."""
    if not stack:
        raise DataError(f"{source}:{line}: text outside brackets: {tok!r}")
    frame = stack[-1]
    if frame.label is None:
        frame.label = tok
    elif frame.word is None and not frame.children:
        frame.word = tok
    else:
        raise DataError(
            f"{source}:{line}: node '{frame.label}' has more than one word or mixes words "
            f"and constituents (at {tok!r})"
        )


def parse_tree(text: str, source: str = "<string>") -> Tree:
    """Parse exactly one bracketed tree."""
    trees = list(iter_trees(text, source))
    if len(trees) != 1:
        raise DataError(f"{source}: expected one tree, found {len(trees)}")
    return trees[0][1]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise DataError(f"{path}: no such file") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from e


def read_trees(path: Path | str) -> list[Tree]:
    """Read every tree of a bracketed file (``.mrg``: several multi-line trees per file)."""
    path = Path(path)
    return [tree for _, tree in iter_trees(_read_text(path), str(path))]


def read_trees_with_lines(path: Path | str) -> list[tuple[int, Tree]]:
    """Like :func:`read_trees`, with the line where each tree starts (for messages)."""
    path = Path(path)
    return list(iter_trees(_read_text(path), str(path)))


# --------------------------------------------------------------------------------- cleaning
_FUNCTION_TAG = re.compile(r"[-=]")


def strip_label(label: str) -> str:
    """Drop function tags and indices: ``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``."""
    if label.startswith("-"):  # -NONE-, -LRB-, -RRB- are whole labels, not tag + suffix
        return label
    label = label.split("|", 1)[0]  # ADVP|PRT: the annotators' doubt, keep the first
    return _FUNCTION_TAG.split(label, 1)[0] or label


def _clean(root: Tree) -> Tree | None:
    """Cleaned copy of ``root``, or None when nothing but empty elements is under it.
    Post-order with a stack, not recursion: a deep tree must not exceed Python's limit."""
    done: dict[int, Tree | None] = {}
    stack: list[tuple[Tree, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if node.is_preterminal:
            done[id(node)] = None if node.label == TRACE_TAG else Tree(strip_label(node.label), [], node.word)
        elif not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in node.children)
        else:
            kids = [k for k in (done.pop(id(child)) for child in node.children) if k is not None]
            done[id(node)] = Tree(strip_label(node.label), kids) if kids else None
    return done[id(root)]


def clean_tree(tree: Tree) -> Tree | None:
    """Clean a treebank tree as described in the module docstring (returns a new tree).

    Returns None when the tree has no words at all (only empty elements).
    """
    cleaned = _clean(tree)
    if cleaned is None:
        return None
    # Strip wrappers after cleaning: the outer bracket may hold a trace beside the tree.
    while cleaned.label in ROOT_WRAPPERS and len(cleaned.children) == 1:
        child = cleaned.children[0]
        if child.is_preterminal:
            break
        cleaned = child
    if cleaned.label in ROOT_WRAPPERS or cleaned.is_preterminal:
        # A wrapper over several pieces (or a bare word) needs a named root.
        cleaned = Tree(FALLBACK_ROOT, cleaned.children if not cleaned.is_preterminal else [cleaned])
    return cleaned


# ---------------------------------------------------------------------------- linearization
def linearize(tree: Tree, placeholder: str = PLACEHOLDER, *, spell: Container[str] = ()) -> list[str]:
    """Target tokens: ``(LABEL`` ... ``)LABEL`` per constituent, ``placeholder`` per word,
    or the word itself for the words in ``spell`` (see :data:`TARGETS`)."""
    out: list[str] = []
    # Stack items are nodes to open, or closing tokens (str) to emit after the children.
    stack: list[Tree | str] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif item.is_preterminal:
            out.append(item.word if item.word is not None and item.word in spell else placeholder)
        else:
            out.append("(" + item.label)
            stack.append(")" + item.label)
            stack.extend(reversed(item.children))
    return out


def tree_to_string(tree: Tree) -> str:
    """One-line bracketed form, ``(S (NP (DT the) (NN cat)) (VP (VBD sat)))``.

    Words are written as they are: the treebank spells brackets ``-LRB-``/``-RRB-``, so a
    word holding ``(`` or ``)`` (from raw user text) would not read back the same.
    """
    parts: list[str] = []
    stack: list[Tree | str] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif item.is_preterminal:
            parts.append(f"({item.label} {item.word})")
        else:
            parts.append("(" + item.label)
            stack.append(")")
            stack.extend(reversed(item.children))
    # Join with spaces, except none before a closing bracket.
    text = " ".join(parts)
    return text.replace(" )", ")")


def is_well_formed(pred_tokens: Sequence[str], n_words: int, placeholder: str = PLACEHOLDER) -> bool:
    """True when ``pred_tokens`` needs no repair: one balanced tree, exactly ``n_words``
    placeholders, labeled brackets, every constituent non-empty, closers matching openers."""
    stack: list[list] = []  # [label, has_word]
    words = 0
    roots = 0
    for tok in pred_tokens:
        if tok == placeholder:
            if not stack:
                return False
            words += 1
            for frame in stack:
                frame[1] = True
        elif tok.startswith("(") and len(tok) > 1:
            if not stack:
                roots += 1
            stack.append([tok[1:], False])
        elif tok.startswith(")"):
            if not stack:
                return False
            label, has_word = stack.pop()
            if not has_word or tok[1:] not in ("", label):
                return False
        else:
            return False
    return not stack and roots == 1 and words == n_words


# ------------------------------------------------------------------------------ baselines
def flat_tree(words: Sequence[str], label: str = "S", tag: str = PLACEHOLDER) -> Tree:
    """The flat baseline: one ``label`` bracket over all the words."""
    if not words:
        raise DataError("cannot build a parse tree over an empty sentence")
    return Tree(label, [Tree(tag, [], w) for w in words])


def right_branching_tree(words: Sequence[str], root: str = "S", label: str = "NP",
                         tag: str = PLACEHOLDER) -> Tree:
    """The right-branching baseline: a binary tree whose every suffix of two or more words
    is a constituent, ``(S w1 (NP w2 (NP w3 w4)))``; the root labelled ``root``, the others
    ``label`` (English phrases branch to the right; NP is the commonest phrase label)."""
    if not words:
        raise DataError("cannot build a parse tree over an empty sentence")
    node = Tree(tag, [], words[-1])
    for i in range(len(words) - 2, -1, -1):  # iterative: sentences can be long
        node = Tree(root if i == 0 else label, [Tree(tag, [], words[i]), node])
    return node if not node.is_preterminal else Tree(root, [node])


# ----------------------------------------------------------------------------- rebuilding
_DISSOLVE = "\x00dissolve"
"""Internal label of brackets kept for pairing but removed from the final tree."""


def _is_label(label: str) -> bool:
    """A label that prints and reads back: not empty, no brackets, no spaces."""
    return bool(label) and not any(c in "()" or c.isspace() for c in label)


def _prune_and_dissolve(node: Tree) -> list[Tree]:
    """Post-order repair: drop wordless constituents, dissolve marked brackets.

    Returns the nodes that replace ``node`` in its parent (none, itself, or its children).
    Iterative, since a model can emit hundreds of nested brackets.
    """
    # frames[k] = (constituent being finished, its finished children so far);
    # iters[k] walks that constituent's original children.
    result: list[Tree] = []
    frames: list[tuple[Tree, list[Tree]]] = [(node, [])]
    iters = [iter(node.children)]
    while frames:
        current, done = frames[-1]
        child = next(iters[-1], None)
        if child is not None:
            if child.is_preterminal:
                done.append(child)
            else:
                frames.append((child, []))
                iters.append(iter(child.children))
            continue
        frames.pop()
        iters.pop()
        if not done:
            replacement: list[Tree] = []
        elif current.label == _DISSOLVE:
            replacement = done
        else:
            current.children = done
            replacement = [current]
        if frames:
            frames[-1][1].extend(replacement)
        else:
            result = replacement
    return result


def _bracket_nodes(pred_tokens: Sequence[str], n_words: int, preterminal: Callable[[int], Tree],
                   placeholder: str, known: frozenset[str] | None) -> tuple[list[Tree], int]:
    """The predicted brackets as nodes (unknown or malformed labels marked to be dissolved),
    with a preterminal for each placeholder up to ``n_words``; returns the top-level nodes
    and the number of words placed."""
    top: list[Tree] = []
    stack: list[Tree] = []
    n = 0  # words placed so far
    for tok in pred_tokens:
        siblings = stack[-1].children if stack else top
        if tok == placeholder:
            if n < n_words:
                siblings.append(preterminal(n))
                n += 1
        elif tok.startswith("("):
            label = tok[1:]
            if not _is_label(label) or (known is not None and label not in known):
                label = _DISSOLVE
            node = Tree(label)
            siblings.append(node)
            stack.append(node)
        elif tok.startswith(")"):
            if stack:
                stack.pop()
        # Anything else (<unk>, a bare label) carries no structure: dropped.
    return top, n


def rebuild(
    pred_tokens: Sequence[str],
    words: Sequence[str],
    tags: Sequence[str] | None = None,
    *,
    placeholder: str = PLACEHOLDER,
    labels: Iterable[str] | None = None,
) -> Tree:
    """Turn predicted target tokens into a tree over ``words``, repairing if needed.

    ``tags`` (one per word) become the POS tags; without them every POS tag is
    ``placeholder``. ``labels``, when given, is the set of known phrase labels; brackets
    with other labels are dissolved. The repair rules are in the module docstring; the
    result always has exactly ``words`` as leaves, in order, under one root.
    """
    if not words:
        raise DataError("cannot build a parse tree over an empty sentence")
    if tags is not None and len(tags) != len(words):
        raise DataError(f"{len(tags)} POS tags for {len(words)} words")
    known = frozenset(labels) if labels is not None else None

    def preterminal(i: int) -> Tree:
        return Tree(tags[i] if tags is not None else placeholder, [], words[i])

    top, n = _bracket_nodes(pred_tokens, len(words), preterminal, placeholder, known)
    pieces = _prune_and_dissolve(Tree(_DISSOLVE, top))
    if len(pieces) == 1 and not pieces[0].is_preterminal:
        root = pieces[0]
    else:
        root = Tree(FALLBACK_ROOT, pieces)
    root.children.extend(preterminal(i) for i in range(n, len(words)))
    if logger.isEnabledFor(logging.DEBUG) and not is_well_formed(pred_tokens, len(words), placeholder):
        logger.debug("repaired malformed prediction: %s", " ".join(pred_tokens))
    return root
