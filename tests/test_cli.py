"""The `jaxinterp` command line (`demo`, `explain`, `count`) and its op counter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from helpers import flags_off
from jax import lax

import jaxinterp
from jaxinterp._cli import main, parse_arg_specs
from jaxinterp._count import count_staged

TARGET_SOURCE = textwrap.dedent(
    """
    import jax.numpy as jnp
    from jax import lax

    NOT_A_FUNCTION = 3


    def mlp(x, w):
        return jnp.sum(jnp.tanh(x @ w))


    def rnn(h, xs):
        return lax.scan(lambda h, x: (jnp.tanh(h * 2.0 + x), None), h, xs)[0]


    def shift(x, s):
        return x * jnp.exp(s) + 1.0


    def broken(x):
        return x @ jnp.ones((5,))


    class Net:
        @staticmethod
        def apply(x):
            return jnp.sin(x)
    """
)
# The line of the failing `@` in `broken`, as the error message cites it.
BROKEN_LINE = TARGET_SOURCE.splitlines().index("    return x @ jnp.ones((5,))") + 1


# Equations on mutable references: under JAX's hijax flags a `scan` keeps
# its carry in references, so these appear beside the flags-off counts.
_REF_PRIMITIVES = {"new_ref", "get", "swap", "addupdate", "freeze", "empty_ref"}


def _ref_eqns(counts) -> int:
    return sum(n for name, n in counts.items() if name in _REF_PRIMITIVES)


def _without_refs(counts) -> dict:
    return {k: n for k, n in counts.items() if k not in _REF_PRIMITIVES}


@pytest.fixture
def target(tmp_path, monkeypatch):
    """A module `cli_target` importable from the working directory."""
    (tmp_path / "cli_target.py").write_text(TARGET_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cli_target", raising=False)
    yield "cli_target"
    sys.modules.pop("cli_target", None)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# ---------------------------------------------------------------------------
# explain


def test_explain_prints_jaxpr_counts_and_missing_rules(target, capsys):
    status, out, err = run(
        capsys, "explain", "cli_target:mlp", "--args", "f32[3,4], f32[4,2]"
    )
    assert status == 0 and err == ""
    assert out.startswith("cli_target:mlp(f32[3,4], f32[4,2])")
    assert "a:f32[3,4] b:f32[4,2]" in out  # the Jaxpr
    assert "Equations per primitive (3 in all" in out
    for name in ("dot_general", "tanh", "reduce_sum"):
        assert f"  {name}" in out
    assert "evaluate (jaxinterp.eval_rules): dot_general, reduce_sum, tanh" in out
    if hasattr(jaxinterp, "inverse_rules"):
        missing = jaxinterp.inverse_rules.missing(
            jaxinterp.stage(
                lambda x, w: jnp.sum(jnp.tanh(x @ w)),
                jnp.ones((3, 4)),
                jnp.ones((4, 2)),
            ).closed_jaxpr,
            handled=jaxinterp.higher_order_primitives(),
        )
        assert (
            f"inverse (jaxinterp.inverse_rules): {', '.join(missing) or 'none'}" in out
        )


def test_explain_counts_nested_equations_once(target, capsys):
    status, out, _ = run(
        capsys, "explain", "cli_target:rnn", "--args", "f32[3], f32[5,3]"
    )
    assert status == 0
    section = out.split("Equations per primitive (")[1]
    total = int(section.split(" in all")[0])
    rows = {}
    for line in section.splitlines()[1:]:
        if not line.startswith("  "):
            break
        name, n = line.split()
        rows[name] = int(n)
    # scan, mul, add, tanh (and, under JAX's hijax flags, the references
    # that carry the scan's state)
    assert total - _ref_eqns(rows) == 4
    assert rows["scan"] == 1


@pytest.mark.skipif(
    not hasattr(jaxinterp, "explain_inverse"), reason="inverse not landed yet"
)
def test_explain_includes_the_inverse_report(target, capsys):
    status, out, _ = run(
        capsys,
        "explain",
        "cli_target:shift",
        "--args",
        "f32[3], f32[3]",
        "--argnums",
        "0",
    )
    assert status == 0
    expected = jaxinterp.explain_inverse(
        lambda x, s: x * jnp.exp(s) + 1.0,
        jax.ShapeDtypeStruct((3,), jnp.float32),
        jax.ShapeDtypeStruct((3,), jnp.float32),
        argnums=(0,),
    )
    assert "\nInverse:\n" in out
    assert out.rstrip().endswith(expected.rstrip().splitlines()[-1])


def test_explain_accepts_dotted_names_and_file_paths(target, tmp_path, capsys):
    status, out, _ = run(capsys, "explain", "cli_target:Net.apply", "--args", "f16[2]")
    assert status == 0 and "sin" in out and "f16[2]" in out
    path = str(tmp_path / "cli_target.py")
    status, out, _ = run(capsys, "count", f"{path}:Net.apply", "--args", "bf16[]")
    assert status == 0 and "sin" in out


# ---------------------------------------------------------------------------
# count


def test_count_prints_the_table(target, capsys):
    status, out, err = run(
        capsys, "count", "cli_target:rnn", "--args", "f32[3], f32[5,3]"
    )
    assert status == 0 and err == ""
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line}
    assert rows["mul"] == ["5", "15", "0"]  # 5 steps x 3 elements
    assert rows["add"] == ["5", "15", "0"]
    assert rows["tanh"] == ["5", "0", "15"]
    assert rows["scan"] == ["1", "0", "0"]
    refs = _ref_eqns({k: int(r[0]) for k, r in rows.items() if r and r[0].isdigit()})
    assert rows["total"] == [str(16 + refs), "30", "15"]


# ---------------------------------------------------------------------------
# Errors: one line on stderr, a non-zero status.

ERRORS = [
    (
        ["count", "cli_target"],
        2,
        "jaxinterp: error: expected MODULE:FUNCTION, got 'cli_target' "
        "(e.g. mymodel:loss).",
    ),
    (
        ["count", "no_such_module_xyz:f"],
        1,
        "jaxinterp: error: cannot import module 'no_such_module_xyz' "
        "(ModuleNotFoundError: No module named 'no_such_module_xyz').",
    ),
    (
        ["explain", "cli_target:nope"],
        1,
        "jaxinterp: error: module 'cli_target' has no function 'nope'.",
    ),
    (
        ["count", "cli_target:NOT_A_FUNCTION"],
        1,
        "jaxinterp: error: 'cli_target:NOT_A_FUNCTION' is not callable (it is a int).",
    ),
    (
        ["count", "cli_target:mlp", "--args", "f32[3,4"],
        2,
        "jaxinterp: error: --args: cannot parse 'f32[3,4'; expected a dtype and a "
        "shape such as 'f32[3,4]' or 'i32[]'.",
    ),
    (
        ["count", "cli_target:mlp", "--args", "f8[3]"],
        2,
        "jaxinterp: error: --args: unknown dtype 'f8' in 'f8[3]'; expected one of "
        "bool, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, c64, c128.",
    ),
    (
        ["explain", "cli_target:mlp", "--args", "f32[3 4]"],
        2,
        "jaxinterp: error: --args: bad shape in 'f32[3 4]'; write sizes separated "
        "by commas, as in 'f32[3,4]'.",
    ),
    (
        ["explain", "cli_target:mlp", "--args", "f32[3], , f32[2]"],
        2,
        "jaxinterp: error: --args: cannot parse ''; expected a dtype and a shape "
        "such as 'f32[3,4]' or 'i32[]'.",
    ),
    (
        ["count", "cli_target:broken", "--args", "f32[3,4]"],
        1,
        "jaxinterp: error: tracing cli_target:broken on (f32[3,4]) failed at "
        f"cli_target.py:{BROKEN_LINE}: TypeError: dot_general requires contracting "
        "dimensions to have the same shape, got (4,) and (5,).",
    ),
    (
        ["count", "cli_target:mlp", "--args", "f32[3,4]"],
        1,
        "jaxinterp: error: tracing cli_target:mlp on (f32[3,4]) failed: "
        "TypeError: mlp() missing 1 required positional argument: 'w'",
    ),
    (
        ["explain", "cli_target:shift", "--args", "f32[3]", "--argnums", "x"],
        2,
        "jaxinterp: error: --argnums: expected argument positions such as '0' or "
        "'0,2', got 'x'.",
    ),
    (
        ["count"],
        2,
        "jaxinterp count: error: the following arguments are required: "
        "MODULE:FUNCTION (see `jaxinterp count --help`).",
    ),
]


@pytest.mark.parametrize(
    "argv, status, message", ERRORS, ids=[" ".join(e[0]) for e in ERRORS]
)
def test_bad_input_gives_one_line(target, capsys, argv, status, message):
    got_status, out, err = run(capsys, *argv)
    assert got_status == status
    assert out == ""
    assert err.splitlines() == [message]


def test_unknown_command_gives_one_line(capsys):
    status, out, err = run(capsys, "frobnicate")
    assert status == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("jaxinterp: error: argument COMMAND: invalid choice: ")
    assert "frobnicate" in line and line.endswith("(see `jaxinterp --help`).")


def test_64_bit_dtypes_need_x64(target, capsys):
    if jax.config.jax_enable_x64:
        assert parse_arg_specs("f64[2]")[0].dtype == jnp.float64
        return
    status, _, err = run(capsys, "count", "cli_target:mlp", "--args", "f64[2]")
    assert status == 2
    assert err == (
        "jaxinterp: error: --args: 'f64[2]' needs 64-bit mode; set JAX_ENABLE_X64=1.\n"
    )


def test_parse_arg_specs():
    specs = parse_arg_specs(" f32[3, 4],i32[] ,bf16[0], bool[2,1,1], u8[7] ")
    assert [(s.shape, str(s.dtype)) for s in specs] == [
        ((3, 4), "float32"),
        ((), "int32"),
        ((0,), "bfloat16"),
        ((2, 1, 1), "bool"),
        ((7,), "uint8"),
    ]
    assert parse_arg_specs("") == []


@pytest.mark.parametrize("command", [[], ["demo"], ["explain"], ["count"]])
def test_help_documents_each_command(capsys, command):
    status, out, _ = run(capsys, *command, "--help")
    assert status == 0
    assert out.startswith("usage: jaxinterp")
    if command in (["explain"], ["count"]):
        assert "MODULE:FUNCTION" in out and "--args" in out and "f32[3,4]" in out


def test_demo_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "jaxinterp", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for i, heading in enumerate(
        ["stage:", "evaluate:", "it composes:", "count:", "substitute:"], start=1
    ):
        assert f"== {i}. {heading}" in out
    assert "bit-identical: True" in out
    assert "d loss / d b = [1. 1. 1.]" in out
    assert "dot_general         2     36" in out


# ---------------------------------------------------------------------------
# The counter behind `count`, against hand counts and XLA's cost analysis.


def xla_cost(fn, *args):
    cost = jax.jit(fn).lower(*args).cost_analysis()
    return cost.get("flops", 0.0), cost.get("transcendentals", 0.0)


def counted(fn, *args):
    counts = count_staged(jaxinterp.stage(fn, *args))
    return counts.total_flops, counts.total_transcendentals


def dense(x, w, b):
    return jnp.tanh(x @ w + b) * 2.0


def conv_same(x, k):
    return lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def conv_dilated(x, k):
    return lax.conv_general_dilated(
        x,
        k,
        (2, 1),
        ((1, 2), (0, 1)),
        lhs_dilation=(2, 1),
        rhs_dilation=(1, 2),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        feature_group_count=2,
    )


XLA_CASES = [
    ("dense", dense, [(8, 16), (16, 4), (4,)]),
    ("conv_same", conv_same, [(2, 5, 10, 3), (3, 3, 3, 4)]),
    ("conv_dilated", conv_dilated, [(2, 4, 7, 9), (6, 2, 3, 2)]),
    ("reduce_max", lambda x: jnp.max(x, axis=1), [(6, 7)]),
    ("integer_pow", lambda x: x**5 + x**-2, [(10,)]),
    ("where", lambda x: jnp.where(x > 0, x, jnp.exp(x)), [(9,)]),
    (
        "batched_dot",
        lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
        [(3, 4, 5), (3, 5, 6)],
    ),
]


@pytest.mark.parametrize(
    "fn, shapes", [c[1:] for c in XLA_CASES], ids=[c[0] for c in XLA_CASES]
)
def test_flops_match_xla_cost_analysis(fn, shapes):
    args = [jnp.ones(s) for s in shapes]
    assert counted(fn, *args) == xla_cost(fn, *args)


def test_counts_by_hand():
    x, w, b = jnp.ones((8, 16)), jnp.ones((16, 4)), jnp.ones(4)
    counts = count_staged(jaxinterp.stage(dense, x, w, b))
    assert counts.flops["dot_general"] == 2 * 8 * 16 * 4
    assert counts.flops["add"] == counts.flops["mul"] == 32
    assert counts.transcendentals["tanh"] == 32


def test_scan_bodies_count_times_the_trip_count():
    def rnn(h, ws):
        return lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, ws)[0]

    h, ws = jnp.ones((4, 8)), jnp.ones((5, 8, 8))
    counts = count_staged(jaxinterp.stage(rnn, h, ws))
    assert _without_refs(counts.eqns) == {"scan": 1, "dot_general": 5, "tanh": 5}
    assert counts.flops["dot_general"] == 5 * 2 * 4 * 8 * 8
    # XLA counts one iteration of the loop it lowers to (plus its counter).
    xla_flops, _ = flags_off(xla_cost, rnn, h, ws)
    assert xla_flops - 2 == counts.total_flops // 5


def test_cond_counts_its_most_expensive_branch_and_while_once():
    def f(p, x):
        y = lax.cond(p, lambda x: x @ x, lambda x: x + 1.0, x)
        return lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, y)
        )

    counts = count_staged(jaxinterp.stage(f, True, jnp.ones((4, 4))))
    assert counts.flops["dot_general"] == 2 * 4 * 4 * 4
    assert "add" in counts.eqns  # the loop counter, not the lighter branch
    assert counts.flops["mul"] == 16 and counts.while_loops == 1
    assert "`while` loop(s) with a runtime trip count" in counts.table()


def test_call_like_primitives_are_walked():
    @jax.jit
    def inner(x):
        return jax.nn.relu(x) + jax.checkpoint(jnp.sin)(x)

    counts = count_staged(jaxinterp.stage(lambda x: inner(x) * 3.0, jnp.ones(5)))
    assert counts.eqns["jit"] >= 1 and counts.eqns["custom_jvp_call"] == 1
    assert counts.eqns[jaxinterp._jax_compat.remat_p.name] == 1
    assert counts.flops["max"] == counts.flops["mul"] == counts.flops["add"] == 5
    assert counts.transcendentals["sin"] == 5
