"""The one reader of a compiled program's HLO text (`compiled.as_text()`).

    module = parse(hlo_text)
    for computation in module.computations.values():
        for op in computation.instructions:
            op.name, op.opcode, op.arrays, op.operands, op.calls, op.attributes

A module is computations; ENTRY is the one the program runs, the others are
called by its instructions: fusion bodies (`calls=`), reductions (`to_apply=`),
loops (`body=`, `condition=`), branches. Each instruction is one line as XLA
prints it, or several where an attribute's value spans lines:

    [ROOT] %name = TYPE opcode(operands), attribute=value, ...

TYPE is an array, `bf16[8,32]{1,0}` (dtype, shape, layout), or a tuple of them.
Operands are named, not typed, in a compiled module, so an operand's shape is
its defining instruction's (`Module.types`). `trip_counts` says how often each
computation runs per execution of the program (loop bodies run once a trip:
roofline/compiled/loops.py).
roofline/compiled/program.py (collectives, kernels, matmul dtypes) and roofline/compiled/kinds.py
(what kind of work an op does) read HLO through this module only.
"""

import dataclasses
import functools
import re

from roofline.compiled.arrays import arrays
from roofline.compiled.loops import trip_counts

# Attributes whose values name computations: the ones an instruction calls.
CALL_ATTRIBUTES = {"calls", "to_apply", "body", "condition", "branch_computations"}
CALL_ATTRIBUTES |= {"true_computation", "false_computation", "called_computations"}

_NAME = r"%?([\w.\-]+)"
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?" + _NAME + r"\s*=\s*")
_HEADER = re.compile(r"^(ENTRY\s+)?" + _NAME + r"\s*\(")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_COMMENT = re.compile(r"/\*.*?\*/")  # XLA numbers long lists: /*index=5*/
_OPENS, _CLOSES = "([{", ")]}"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction, as printed."""

    name: str
    type_text: str  # its result's type, e.g. "(bf16[2,32]{1,0}, bf16[8,32]{1,0})"
    opcode: str  # "fusion", "dot", "all-gather-start", ...
    operands: tuple  # names of the instructions (or parameters) it reads
    literal: str  # the text in its parentheses where that is no operand list:
    # a parameter's number, a constant's value; "" otherwise
    attributes: dict  # name -> value text, in order: {"calls": "%fused_dot", ...}
    attribute_text: str  # the same, as printed: ", kind=kLoop, calls=%fused_dot"
    calls: dict  # attribute -> the computations it names: {"calls": ("fused_dot",)}
    root: bool = False  # the computation's result

    @property
    def arrays(self):
        """The arrays of its result (a tuple's elements in order)."""
        return arrays(self.type_text)

    @property
    def dtype(self):
        """Its result's dtype (a tuple's first element's), or None."""
        return next((a.dtype for a in self.arrays), None)

    @property
    def shape(self):
        """Its result's shape (a tuple's first element's), or None."""
        return next((a.shape for a in self.arrays), None)

    @property
    def called(self):
        """Every computation it calls, in order."""
        return tuple(name for names in self.calls.values() for name in names)

    @property
    def target(self):
        """A custom call's target ('__cublas$gemm', 'tpu_custom_call'), else None."""
        value = self.attributes.get("custom_call_target")
        return value.strip('"') if value is not None else None


@dataclasses.dataclass(frozen=True)
class Computation:
    """One computation: its parameters as the header names them, its instructions in order."""

    name: str
    entry: bool
    parameters: tuple  # ((name, type text), ...)
    instructions: tuple  # of Instruction

    @property
    def root(self):
        return next((i for i in self.instructions if i.root), None)


@dataclasses.dataclass(frozen=True)
class Module:
    """An HLO module: {name: Computation}, in the order printed. Instructions
    written outside any computation (a snippet) are in one named ""."""

    computations: dict

    @property
    def entry(self):
        return next((c for c in self.computations.values() if c.entry), None)

    def instructions(self):
        """(computation, instruction) for every instruction of the module."""
        for computation in self.computations.values():
            for instruction in computation.instructions:
                yield computation, instruction

    @functools.cached_property
    def types(self):
        """{name: type text} of every instruction and computation parameter
        (names are unique within a module; an instruction's wins)."""
        found = {i.name: i.type_text for _, i in self.instructions()}
        for computation in self.computations.values():
            for name, type_text in computation.parameters:
                found.setdefault(name, type_text)
        return found

    @functools.cached_property
    def trip_counts(self):
        """{computation name: how many times it runs per execution}, for the
        bodies of `while` loops and everything they call; computations not
        listed run once (roofline/compiled/loops.py reads the counts)."""
        return trip_counts(self)


def _scan(text):
    """(index, character, bracket depth after it) of each character outside quotes."""
    depth, quoted, escaped = 0, False, False
    for i, ch in enumerate(text):
        if quoted:
            quoted = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
            continue
        if ch == '"':
            quoted = True
            continue
        if ch in _OPENS:
            depth += 1
        elif ch in _CLOSES:
            depth -= 1
        yield i, ch, depth


def _split(text):
    """text split at commas outside brackets and quotes."""
    cuts = [i for i, ch, depth in _scan(text) if ch == "," and depth == 0]
    parts = [text[a + 1 : b] for a, b in zip([-1, *cuts], [*cuts, len(text)])]
    return [p.strip() for p in parts if p.strip()]


def _closing(text, start):
    """Index of the bracket closing the one at text[start], or -1."""
    for i, ch, depth in _scan(text[start:]):
        if ch in _CLOSES and depth == 0:
            return start + i
    return -1


def _balance(text):
    """Open brackets minus closed ones, outside quotes: > 0 while a line continues."""
    if '"' not in text:  # most lines: no need to look at each character
        return sum(map(text.count, _OPENS)) - sum(map(text.count, _CLOSES))
    depths = [depth for _, _, depth in _scan(text)]
    return depths[-1] if depths else 0


def parse_instruction(text):
    """One Instruction from its text (joined if it spans lines), or None if it is none."""
    head = _INSTRUCTION.match(text)
    if not head:
        return None
    rest = text[head.end() :]
    # A tuple type runs to its closing parenthesis, an array's to the first space.
    end = _closing(rest, 0) if rest.startswith("(") else rest.find(" ") - 1
    if end < 0:
        return None
    type_text, rest = rest[: end + 1], rest[end + 1 :]
    opcode = _OPCODE.match(rest)
    if not opcode:
        return None
    open_at = opcode.end() - 1
    close_at = _closing(rest, open_at)
    if close_at < 0:
        return None
    inside, attribute_text = rest[open_at + 1 : close_at], rest[close_at + 1 :]
    literal, operands = "", ()
    if opcode.group(1) in ("parameter", "constant"):
        literal = inside.strip()
    else:  # each operand may be printed with its type in front: 'f32[8]{0} %a'
        operands = tuple(part.split()[-1].lstrip("%") for part in _split(_COMMENT.sub("", inside)))
    attributes = {
        key.strip(): value.strip()
        for key, _, value in (part.partition("=") for part in _split(attribute_text))
    }
    # '%body', or several: '{%a, %b}'
    calls = {k: tuple(re.findall(_NAME, v)) for k, v in attributes.items() if k in CALL_ATTRIBUTES}
    name, root = head.group(2), bool(head.group(1))
    return Instruction(
        name, type_text, opcode.group(1), operands, literal, attributes, attribute_text, calls, root
    )


def _header(line):
    """(name, is ENTRY, parameters) of a computation's header line, or None.

    `[ENTRY] %name (p0: bf16[16,8], p1: f32[]) -> f32[16,32] {`, unindented."""
    if line[:1].isspace() or not line.rstrip().endswith("{"):
        return None
    found = _HEADER.match(line)
    if not found:
        return None
    close = _closing(line, found.end() - 1)
    if close < 0 or "->" not in line[close:]:
        return None
    parameters = []
    for part in _split(_COMMENT.sub("", line[found.end() : close])):
        name, _, type_text = part.partition(":")
        parameters.append((name.strip().lstrip("%"), type_text.strip()))
    return found.group(2), bool(found.group(1)), tuple(parameters)


@functools.lru_cache(maxsize=8)
def parse(hlo_text):
    """The Module of an HLO module's text, as `compiled.as_text()` prints it.

    A computation starts at its unindented header and runs to the next one;
    its closing brace is no marker (an attribute's value may span lines that
    start with one). An instruction continues over lines until its brackets
    close. Parsed once per text (cached): several readers share it."""
    found = {}  # name -> [is entry, parameters, instructions]
    current, pending = None, ""
    for line in hlo_text.splitlines():
        if pending:
            pending += "\n" + line
            if _balance(pending) > 0:
                continue
            line, pending = pending, ""
        else:
            header = _header(line)
            if header:
                current = header[0]
                found[current] = [header[1], header[2], []]
                continue
            if not _INSTRUCTION.match(line):
                continue
            if _balance(line) > 0:
                pending = line
                continue
        instruction = parse_instruction(line)
        if instruction is None:
            continue
        if current is None:
            current = ""
            found[current] = [False, (), []]
        found[current][2].append(instruction)
    return Module(
        {
            name: Computation(name, entry, parameters, tuple(instructions))
            for name, (entry, parameters, instructions) in found.items()
        }
    )
