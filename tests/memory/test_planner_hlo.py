"""HLO buffer parsing (jaxcnn.memory.hlo) on CPU: compiled conv net / MLP and hand-written HLO."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxcnn.memory import live_bytes_lower_bound
from jaxcnn.memory.hlo import (
    compiled_buffers,
    hlo_buffer_roles,
    hlo_buffers,
    leaf_bytes,
    parse_buffer_assignment,
)
from jaxcnn.memory.footprint import memory_stats


def conv_net(x, w1, w2):
    dn = ("NHWC", "HWIO", "NHWC")
    y = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    y = jax.nn.relu(lax.conv_general_dilated(y, w2, (1, 1), "SAME", dimension_numbers=dn))
    return y.mean(axis=(1, 2))


def mlp(x, w1, b1, w2, b2):
    h = jax.nn.relu(x @ w1 + b1)
    return jax.nn.log_softmax(h @ w2 + b2), h.sum()


def _conv_args():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    return (
        jax.random.normal(k[0], (2, 16, 16, 3)),
        jax.random.normal(k[1], (3, 3, 3, 8)),
        jax.random.normal(k[2], (3, 3, 8, 16)).astype(jnp.bfloat16).astype(jnp.float32),
    )


def _mlp_args():
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    return (
        jax.random.normal(k[0], (4, 32)),
        jax.random.normal(k[1], (32, 64)),
        jnp.zeros((64,)),
        jax.random.normal(k[2], (64, 10)),
        jnp.zeros((10,)),
    )


CASES = {"conv_net": (conv_net, _conv_args), "mlp": (mlp, _mlp_args)}


def _compile(case):
    fn, make_args = CASES[case]
    args = make_args()
    compiled = jax.jit(fn).lower(*args).compile()
    return fn, args, compiled, compiled.as_text()


def _entry_instrs(text):
    """Independent, simpler reading of ENTRY: name -> (shape text, opcode, line)."""
    body = text.split("\nENTRY", 1)[1].split("\n}", 1)[0].splitlines()[1:]
    out = {}
    for line in body:
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (\([^=]*?\)|\S+) ([\w-]+)\(", line)
        assert m, line
        out[m.group(1)] = (m.group(2), m.group(3), line)
    return out


_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1,
             "s64": 8, "f64": 8}


def _np_bytes(shape):
    dtype, dims = re.match(r"(\w+)\[([^\]]*)\]", shape).groups()
    return int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64)) * _ITEMSIZE[dtype]


@pytest.mark.parametrize("case", sorted(CASES))
def test_sizes_match_hlo_shapes(case):
    _, _, _, text = _compile(case)
    instrs = _entry_instrs(text)
    buffers = hlo_buffers(text)
    assert buffers and all(b.size_bytes > 0 for b in buffers)
    for b in buffers:
        shape, _, _ = instrs[b.name.split("#")[0]]
        if "#" not in b.name:  # array-shaped result: the whole shape is this buffer
            assert b.size_bytes == _np_bytes(shape), (b, shape)


@pytest.mark.parametrize("case", sorted(CASES))
def test_operands_defined_before_use(case):
    _, _, _, text = _compile(case)
    instrs = _entry_instrs(text)
    order = {name: i for i, name in enumerate(instrs)}
    by_name = {b.name: b for b in hlo_buffers(text)}
    for name, (_, opcode, line) in instrs.items():
        operand_text = line.split(f" {opcode}(", 1)[1]
        for op in re.findall(r"%([\w.\-]+)", operand_text.split("), ")[0]):
            assert order[op] < order[name], (op, name)
            if op in by_name:  # a real (non-aliasing) buffer must be live where it is read
                assert by_name[op].start <= order[name] <= by_name[op].end, (op, name)
    for b in by_name.values():
        assert 0 <= b.start <= b.end < len(instrs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_params_and_outputs_span_program(case):
    fn, args, compiled, text = _compile(case)
    n_steps = len(_entry_instrs(text))
    roles = hlo_buffer_roles(text)
    params = [b for b, r in roles if r == "parameter"]
    outputs = [b for b, r in roles if r == "output"]
    assert len(params) == len(args)
    for b in params + outputs:
        assert (b.start, b.end) == (0, n_steps - 1)
    # Output leaves hold exactly the result arrays (the tuple's pointer table is not a buffer).
    results = jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))
    assert sum(b.size_bytes for b in outputs) == sum(r.size * r.dtype.itemsize for r in results)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fusions_counted_once(case):
    _, _, _, text = _compile(case)
    instrs = _entry_instrs(text)
    fusions = [n for n, (shape, op, _) in instrs.items() if op == "fusion"]
    assert fusions, "expected XLA to fuse something"
    names = [b.name.split("#")[0] for b in hlo_buffers(text, share=False)]
    for f in fusions:
        shape = instrs[f][0]
        expected = 1 if not shape.startswith("(") else shape.count("[")
        assert names.count(f) == expected
    # Nothing from the fused computations' bodies leaks in: every buffer is an ENTRY instruction.
    assert set(names) <= set(instrs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_analysis_relations(case):
    fn, args, compiled, text = _compile(case)
    stats = memory_stats(compiled)
    for key in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes"):
        assert key in stats and stats[key] >= 0
    params = hlo_buffers(text, roles=("parameter",))
    assert sum(b.size_bytes for b in params) == stats["argument_size_in_bytes"]
    # Sanity relation, not an identity: the peak of concurrently live temps (our inclusive
    # intervals, no in-place reuse) can exceed XLA's temp allocation, since XLA lets elementwise
    # fusions overwrite a dying operand and may place temps in the output allocation; it cannot
    # exceed all memory the executable owns (temp + output + argument allocations).
    temps = hlo_buffers(text, roles=("temp",))
    bound = live_bytes_lower_bound(temps)
    total = sum(stats[k] for k in ("temp_size_in_bytes", "output_size_in_bytes",
                                   "argument_size_in_bytes"))
    assert 0 < bound <= total
    # The largest single temp must fit in the temp allocation (a buffer cannot be split).
    assert max(b.size_bytes for b in temps) <= stats["temp_size_in_bytes"]


def test_compiled_buffers_convenience():
    buffers, stats = compiled_buffers(mlp, *_mlp_args())
    text = jax.jit(mlp).lower(*_mlp_args()).compile().as_text()
    assert buffers == hlo_buffers(text)
    assert stats["argument_size_in_bytes"] == sum(a.nbytes for a in _mlp_args())


def test_memory_stats_tolerates_missing():
    class NoneAnalysis:
        def memory_analysis(self):
            return None

    class Raises:
        def memory_analysis(self):
            raise NotImplementedError

    class Partial:
        def memory_analysis(self):
            return type("A", (), {"temp_size_in_bytes": 7, "output_size_in_bytes": None})()

    class Dict:
        def memory_analysis(self):
            return {"argument_size_in_bytes": 3, "peak_memory_in_bytes": 9}

    assert memory_stats(NoneAnalysis()) == {}
    assert memory_stats(Raises()) == {}
    assert memory_stats(Partial()) == {"temp_size_in_bytes": 7}
    assert memory_stats(Dict()) == {"argument_size_in_bytes": 3, "peak_memory_in_bytes": 9}


HAND_HLO = """\
HloModule m, is_scheduled=true

%fused (p0: f32[4,8]) -> (f32[4,8], s32[4]) {
  %p0 = f32[4,8]{1,0} parameter(0)
  %inner_big = f32[4,8]{1,0} exponential(%p0)
  %inner_idx = s32[4]{0} iota(), iota_dimension=0
  ROOT %t = (f32[4,8]{1,0}, s32[4]{0}) tuple(%inner_big, %inner_idx)
}

ENTRY %main (a: f32[4,8], pair: (bf16[16], pred[3])) -> (f32[32], s32[4], bf16[16]) {
  %a = f32[4,8]{1,0} parameter(0)
  %pair = (bf16[16]{0}, pred[3]{0}) parameter(1)
  %c = f32[] constant(1)
  %multi = (f32[4,8]{1,0}, s32[4]{0}) fusion(%a), kind=kLoop, calls=%fused
  %g0 = f32[4,8]{1,0} get-tuple-element(%multi), index=0
  %g1 = s32[4]{0} get-tuple-element(%multi), index=1
  %flat = f32[32]{0} bitcast(%g0)
  %h = bf16[16]{0} get-tuple-element(%pair), index=0
  %neg = f32[32]{0} negate(f32[32]{0} %flat)
  %idx2 = s32[4]{0} add(%g1, %g1)
  %last = u8[2,3]{1,0:T(2,128)} broadcast(u8[] %k), dimensions={}
  ROOT %out = (f32[32]{0}, s32[4]{0}, bf16[16]{0}) tuple(%neg, %g1, %h)
}
"""


def test_hand_written_tuples_bitcasts_gte():
    roles = {b.name: (b, r) for b, r in hlo_buffer_roles(HAND_HLO)}
    # Steps: a0 pair1 c2 multi3 g0_4 g1_5 flat6 h7 neg8 idx2_9 last10 out11.
    assert set(roles) == {"a", "pair#0", "pair#1", "c", "multi#0", "multi#1", "neg", "idx2", "last"}
    size = {n: b.size_bytes for n, (b, _) in roles.items()}
    assert size == {"a": 128, "pair#0": 32, "pair#1": 3, "c": 4, "multi#0": 128, "multi#1": 16,
                    "neg": 128, "idx2": 16, "last": 6}
    span = {n: (b.start, b.end) for n, (b, _) in roles.items()}
    # multi#0 is read through gte -> bitcast -> negate: the alias chain extends it to step 8.
    assert span["multi#0"] == (3, 8)
    # multi#1 (via g1) is part of ROOT: output, whole program; so is neg.
    assert roles["multi#1"][1] == "output" and span["multi#1"] == (0, 11)
    assert roles["neg"][1] == "output" and span["neg"] == (0, 11)
    # A tuple parameter: one buffer per element, both program-long, still a parameter role
    # even though element 0 reaches ROOT.
    assert roles["pair#0"][1] == "parameter" and span["pair#0"] == (0, 11)
    assert roles["pair#1"][1] == "parameter"
    assert roles["c"][1] == "constant" and span["c"] == (0, 11)
    assert roles["idx2"][1] == "temp" and span["idx2"] == (9, 9)  # dead value: ends where defined
    assert roles["last"][1] == "temp"  # unknown operand %k is ignored, tiled layout parsed
    # Fused-computation internals never appear.
    assert not {"p0", "inner_big", "inner_idx", "t", "g0", "g1", "flat", "h", "out"} & set(roles)


def test_leaf_bytes_dtypes():
    assert leaf_bytes("f32[8,56,56,64]{3,2,1,0}") == 8 * 56 * 56 * 64 * 4
    assert leaf_bytes("bf16[3]{0}") == 6
    assert leaf_bytes("f16[2,2]") == 8
    assert leaf_bytes("pred[5]{0}") == 5
    assert leaf_bytes("u8[7]") == 7
    assert leaf_bytes("s4[3]{0}") == 2  # packed sub-byte, rounded up
    assert leaf_bytes("f8e4m3fn[10]") == 10
    assert leaf_bytes("c64[2]") == 16
    assert leaf_bytes("f32[]") == 4
    assert leaf_bytes("s32[<=16]{0}") == 64
    with pytest.raises(ValueError):
        leaf_bytes("q99[2]")


SHARE_HLO = """\
HloModule s, is_scheduled=true

%elementwise_only (p0: f32[16], p1: f32[16]) -> f32[16] {
  %p0 = f32[16]{0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %e = f32[16]{0} exponential(%p0)
  ROOT %m = f32[16]{0} multiply(%e, %p1)
}

%reverses (q0: f32[16]) -> f32[16] {
  %q0 = f32[16]{0} parameter(0)
  ROOT %r = f32[16]{0} reverse(%q0), dimensions={0}
}

%dus_root (d0: f32[16], d1: f32[4], d2: s32[]) -> f32[16] {
  %d0 = f32[16]{0} parameter(0)
  %d1 = f32[4]{0} parameter(1)
  %d2 = s32[] parameter(2)
  %b = f32[16]{0} bitcast(%d0)
  ROOT %u = f32[16]{0} dynamic-update-slice(%b, %d1, %d2)
}

ENTRY %main (x: f32[16], y: f32[4], i: s32[]) -> (f32[16], f32[16]) {
  %x = f32[16]{0} parameter(0)
  %y = f32[4]{0} parameter(1)
  %i = s32[] parameter(2)
  %a = f32[16]{0} negate(%x)
  %b = f32[16]{0} add(%a, %a)
  %c = f32[16]{0} fusion(%b, %x), kind=kLoop, calls=%elementwise_only
  %d = f32[16]{0} fusion(%c), kind=kLoop, calls=%reverses
  %e = f32[16]{0} fusion(%d, %y, %i), kind=kLoop, calls=%dus_root
  %keep = f32[16]{0} sqrt(%e)
  %f = f32[16]{0} multiply(%e, %keep)
  %g = pred[16]{0} compare(%f, %f), direction=GT
  %h = f32[16]{0:T(256)} copy(%f)
  ROOT %out = (f32[16]{0}, f32[16]{0}) tuple(%h, %keep)
}
"""


def test_in_place_sharing_rules():
    # Steps: x0 y1 i2 a3 b4 c5 d6 e7 keep8 f9 g10 h11 out12.
    unshared = {b.name for b, _ in hlo_buffer_roles(SHARE_HLO, share=False)}
    assert {"a", "b", "c", "d", "e", "keep", "f", "g", "h"} <= unshared
    roles = {b.name: (b, r) for b, r in hlo_buffer_roles(SHARE_HLO)}
    temps = {n: (b.size_bytes, b.start, b.end) for n, (b, r) in roles.items() if r == "temp"}
    # a -> b (elementwise add of a dying operand) -> c (loop fusion using it elementwise):
    # one buffer. d (reverse is not elementwise) needs its own; e (in-place dynamic-update-
    # slice root on its parameter 0, through a bitcast) writes into d.
    assert temps["a"] == (64, 3, 6)
    # f = multiply(e, keep) joins it too (e dies at f; keep, an output, lives on), read last by
    # the layout-changing copy h, which may not share (different layout) at step 11.
    assert temps["d"] == (64, 6, 11)
    assert not {"b", "c", "e", "f"} & set(temps)
    # g (compare -> pred) changes the byte size: its own buffer.
    assert temps["g"] == (16, 10, 10)
    assert roles["h"][1] == "output" and roles["keep"][1] == "output"
    # Sharing never touches parameters: negate(x) does not write into x.
    assert roles["x"][1] == "parameter"
    # Three temp buffers instead of seven (the peak, a and d at step 6, is 128 B either way).
    temp_bufs = [b for b, r in roles.values() if r == "temp"]
    no_share = hlo_buffers(SHARE_HLO, roles=("temp",), share=False)
    assert sum(b.size_bytes for b in temp_bufs) == 144 < sum(b.size_bytes for b in no_share)
    assert live_bytes_lower_bound(temp_bufs) == live_bytes_lower_bound(no_share) == 128


def test_outputs_from_definition():
    whole = {b.name: b for b in hlo_buffers(SHARE_HLO, roles=("output",))}
    from_def = {b.name: b for b in hlo_buffers(SHARE_HLO, roles=("output",),
                                               outputs_from_definition=True)}
    assert whole.keys() == from_def.keys() == {"h", "keep"}
    assert (whole["h"].start, whole["h"].end) == (0, 12)
    assert (from_def["h"].start, from_def["h"].end) == (11, 12)
    assert (from_def["keep"].start, from_def["keep"].end) == (8, 12)


ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 64, maybe-live-out:
 value: <7 h @0> (size=64,offset=0): f32[16]{0}
 value: <3 a @0> (size=64,offset=0): f32[16]{0}
allocation 1: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:
 value: <0 x @0> (size=64,offset=0): f32[16]{0}
allocation 2: size 16, output shape is |(f32[16], f32[16])|, maybe-live-out:
 value: <9 out{} @0> (size=16,offset=0): (f32[16]{0}, f32[16]{0})
allocation 3: size 144, preallocated-temp:
 value: <4 multi{1} @0> (size=16,offset=128): s32[4]{0}
 value: <5 d @0> (size=64,offset=0): f32[16]{0}
allocation 4: size 4, constant:
 value: <6 constant.1 @0> (size=4,offset=0): f32[]
allocation 5: size 4, thread-local:
 value: <8 add.2 @0> (size=4,offset=0): f32[]
"""


def test_parse_buffer_assignment():
    allocs = parse_buffer_assignment(ASSIGNMENT)
    assert [(a["index"], a["size"], a["kind"]) for a in allocs] == [
        (0, 64, "live-out"), (1, 64, "parameter"), (2, 16, "live-out"), (3, 144, "temp"),
        (4, 4, "constant"), (5, 4, "thread-local"),
    ]
    assert allocs[3]["values"] == [dict(name="multi#1", size=16, offset=128),
                                   dict(name="d", size=64, offset=0)]
    assert allocs[2]["values"][0]["name"] == "out"


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharing_bound_matches_xla_temp_on_small_nets(case):
    # With in-place sharing the temps' live-bytes peak is what XLA's CPU temp allocation holds
    # for these inference-style programs (without it, the bound exceeds it); temps + outputs
    # from definition never exceed temp + output.
    fn, args, compiled, text = _compile(case)
    stats = memory_stats(compiled)
    shared = live_bytes_lower_bound(hlo_buffers(text, roles=("temp",)))
    assert shared <= stats["temp_size_in_bytes"]
    both = live_bytes_lower_bound(hlo_buffers(text, roles=("temp", "output"),
                                              outputs_from_definition=True))
    assert both <= stats["temp_size_in_bytes"] + stats["output_size_in_bytes"]
