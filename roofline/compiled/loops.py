"""How often each computation of a compiled program runs per execution: the
bodies of `while` loops once a trip, and everything they call with them.

    parse(hlo_text).trip_counts   # {computation name: runs}, via trip_counts(module)

A loop's trip count is the one XLA states in its backend_config
(`"known_trip_count":{"n":"16"}`, as the NVIDIA compiler writes it, whose
conditions are fusions), else it is read from its condition, `counter < N`
with N a constant, the form XLA gives the loops it builds itself (collective
matmuls, scans, decode's chunk of steps); a loop whose count cannot be read
(a fori_loop over a traced count) counts once. Reads a roofline.compiled.hlo.Module.
"""

import re

_KNOWN = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def trip_counts(module):
    """{computation name: how many times it runs per execution}, for the
    bodies of `while` loops (and loops inside them) and everything they
    call (fusions, async collectives); computations not listed run once,
    outside any loop."""
    loops = [
        (computation.name, i.calls["body"][0], _trips(module, i, computation))
        for computation, i in module.instructions()
        if i.opcode == "while" and "body" in i.calls and "condition" in i.calls
    ]
    times = {}
    for _ in range(4):  # loops nested up to four deep
        for holder, body, trips in loops:
            times[body] = times.get(holder, 1) * trips
    for body in sorted(times, key=times.get):  # inner loops last: they run more often
        todo = list(_called(module, body))
        while todo:
            name = todo.pop()
            if name in module.computations and times.get(name, 0) < times[body]:
                times[name] = times[body]
                todo += _called(module, name)
    return times


def _called(module, name):
    computation = module.computations.get(name)
    return [c for i in computation.instructions for c in i.called] if computation else []


def _constant(name, scope):
    """The integer value of the constant `name` in scope ({name: instruction}:
    one computation's, as snippets reuse names), seen through copies; or None."""
    op = scope.get(name)
    while op is not None and op.opcode in ("copy", "convert", "bitcast") and op.operands:
        op = scope.get(op.operands[0])
    if op is None or op.opcode != "constant" or not op.literal.lstrip("-").isdigit():
        return None
    return int(op.literal)


def _trips(module, loop, holder):
    """How many trips a `while` (in computation `holder`) makes: its condition
    is `counter < N` (N a constant), its body adds a constant step to the
    counter, and the loop starts it at a constant; else 1. Counters step by
    more than one where XLA unrolled a loop (a bidirectional collective
    matmul steps by 2)."""
    known = _KNOWN.search(loop.attributes.get("backend_config", ""))
    if known:
        return int(known.group(1))
    condition = module.computations.get(loop.calls["condition"][0])
    body = module.computations.get(loop.calls["body"][0])
    if condition is None:
        return 1
    compare = next((i for i in condition.instructions if i.opcode == "compare"), None)
    if compare is None or compare.attributes.get("direction") != "LT":
        return 1
    local = {i.name: i for i in condition.instructions}
    counter = local.get(compare.operands[0])
    limit = _constant(compare.operands[1], local)
    if limit is None or counter is None or counter.opcode != "get-tuple-element":
        return 1
    index = int(counter.attributes.get("index", -1))
    start, step = 0, 1
    outside = {i.name: i for i in holder.instructions}
    init = outside.get(loop.operands[0]) if loop.operands else None
    if init is not None and init.opcode == "tuple" and 0 <= index < len(init.operands):
        start = _constant(init.operands[index], outside) or 0
    inside = {i.name: i for i in body.instructions} if body else {}
    root = body.root if body else None
    if root is not None and root.opcode == "tuple" and 0 <= index < len(root.operands):
        update = inside.get(root.operands[index])
        if update is not None and update.opcode == "add":
            steps = [_constant(n, inside) for n in update.operands]
            step = next((s for s in steps if s), 1)
    return max(1, -(-(limit - start) // step))
