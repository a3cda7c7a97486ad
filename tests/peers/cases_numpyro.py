"""NumPyro's transforms (`numpyro.distributions.transforms`, flows) as cases.

NumPyro's conventions: `t(x)` is the forward map, `t.inv(y)` the inverse, and
`t.log_abs_det_jacobian(x, y)` the forward log-det, summed over
`t.domain.event_dim` only; the reference ildj is minus its sum over every
element, at the library's own `x = t.inv(y)`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from _common import (
    Case,
    corr_cholesky,
    corr_matrix,
    fmt,
    l1_ball,
    lower_cholesky,
    ordered,
    params_rng,
    positive,
    positive_definite,
    positive_ordered,
    real,
    simplex,
    unavailable,
    unit,
    unit_lower,
    well_conditioned,
    zero_sum,
)


def _case(name: str, t: Any, sample: Any, square: bool = True, note: str = "") -> Case:
    def ildj(y: Any) -> Any:
        x = t.inv(y)
        return -jnp.sum(t.log_abs_det_jacobian(x, y))

    return Case("numpyro", name, t, t.inv, ildj, sample, square, note)


def cases() -> list[Case]:
    from numpyro.distributions import constraints as C, transforms as T
    from numpyro.distributions.flows import InverseAutoregressiveTransform
    from numpyro.distributions.transforms import biject_to

    out: list[Case] = []
    add = out.append
    rng = params_rng("numpyro")

    # Elementwise, parameter-free.
    add(_case("ExpTransform()", T.ExpTransform(), real(5)))
    add(_case("SigmoidTransform()", T.SigmoidTransform(), real(5, low=-4, high=4)))
    add(_case("SoftplusTransform()", T.SoftplusTransform(), real(5, low=-4, high=4)))
    add(_case("IdentityTransform()", T.IdentityTransform(), real(5)))
    add(_case("AbsTransform()", T.AbsTransform(), positive(5), note="x > 0 only"))
    add(_case("AbsTransform() on R", T.AbsTransform(), real(5), square=False))
    add(_case("ExpTransform().inv", T.ExpTransform().inv, positive(5)))
    add(_case("SigmoidTransform().inv", T.SigmoidTransform().inv, unit(5)))
    add(_case("SoftplusTransform().inv", T.SoftplusTransform().inv, positive(5)))
    # Affine and power, with parameters.
    for loc, scale in [(0.5, 2.0), (-1.0, -0.5), (1.0, 3.0)]:
        add(
            _case(
                f"AffineTransform(loc={loc}, scale={scale})",
                T.AffineTransform(loc, scale),
                real(5),
            )
        )
    loc, scale = jnp.arange(4.0) - 1, jnp.array([0.5, 2.0, -1.0, 3.0])
    add(
        _case(
            f"AffineTransform(loc={fmt(loc)}, scale={fmt(scale)}, real_vector)",
            T.AffineTransform(loc, scale, domain=C.real_vector),
            real(4),
        )
    )
    for p in [2.0, 0.5, 3.0, -1.0]:
        add(_case(f"PowerTransform({p})", T.PowerTransform(p), positive(5)))
    # Vector and matrix transforms.
    add(_case("OrderedTransform()", T.OrderedTransform(), ordered(5)))
    perm = jnp.array([2, 0, 3, 1])
    add(_case(f"PermuteTransform({fmt(perm)})", T.PermuteTransform(perm), real(4)))
    add(_case("StickBreakingTransform()", T.StickBreakingTransform(), real(4), False))
    add(_case("L1BallTransform()", T.L1BallTransform(), real(4), square=False))
    add(_case("LowerCholeskyTransform()", T.LowerCholeskyTransform(), real(6), False))
    add(
        _case(
            "ScaledUnitLowerCholeskyTransform()",
            T.ScaledUnitLowerCholeskyTransform(),
            real(6),
            False,
        )
    )
    add(
        _case(
            "SoftplusLowerCholeskyTransform()",
            T.SoftplusLowerCholeskyTransform(),
            real(6),
            False,
        )
    )
    add(_case("CorrCholeskyTransform()", T.CorrCholeskyTransform(), real(3), False))
    add(
        _case("CholeskyTransform()", T.CholeskyTransform(), positive_definite(3), False)
    )
    add(
        _case(
            "CorrMatrixCholeskyTransform()",
            T.CorrMatrixCholeskyTransform(),
            corr_matrix(3),
            False,
        )
    )
    tril = jnp.asarray(np.linalg.cholesky(np.array([[2.0, 0.5], [0.5, 1.0]])))
    add(
        _case(
            "LowerCholeskyAffine(loc=[1,-1], scale_tril=chol([[2,.5],[.5,1]]))",
            T.LowerCholeskyAffine(jnp.array([1.0, -1.0]), tril),
            real(2),
        )
    )
    add(
        _case(
            "SimplexToOrderedTransform(anchor_point=0.5)",
            T.SimplexToOrderedTransform(0.5),
            simplex(4),
            False,
        )
    )
    add(_case("ZeroSumTransform(1)", T.ZeroSumTransform(1), real(4), square=False))
    add(
        _case(
            "ReshapeTransform((2, 3), (6,))",
            T.ReshapeTransform((2, 3), (6,)),
            real(6),
        )
    )
    add(_case("HaarTransform()", T.HaarTransform(), real(8)))
    add(_case("HaarTransform(flip=True)", T.HaarTransform(flip=True), real(6)))
    add(_case("DiscreteCosineTransform()", T.DiscreteCosineTransform(), real(6)))
    add(
        _case(
            "DiscreteCosineTransform(smooth=1.0)",
            T.DiscreteCosineTransform(smooth=1.0),
            real(6),
        )
    )
    add(
        _case(
            "RealFastFourierTransform((8,))",
            T.RealFastFourierTransform((8,)),
            real(8),
            square=False,
            note="real -> complex",
        )
    )
    a = well_conditioned(2, rng) * 0.5
    add(
        _case(
            f"RecursiveLinearTransform(A={fmt(a)})",
            T.RecursiveLinearTransform(a),
            real(5, 2),
        )
    )
    add(
        _case(
            "UnpackTransform(vector -> {'a': [2], 'b': [3]})",
            T.UnpackTransform(
                lambda v: {"a": v[..., :2], "b": v[..., 2:]},
                lambda d: jnp.concatenate([d["a"], d["b"]], -1),
            ),
            real(5),
        )
    )
    add(
        _case(
            "CatTransform([Exp, Sigmoid, Affine(1,2)], lengths=[2,2,1])",
            T.CatTransform(
                [T.ExpTransform(), T.SigmoidTransform(), T.AffineTransform(1.0, 2.0)],
                dim=0,
                lengths=[2, 2, 1],
            ),
            real(5),
        )
    )
    add(
        _case(
            "ComposeTransform([Affine(1,2), Sigmoid, Affine(-1,3)])",
            T.ComposeTransform(
                [
                    T.AffineTransform(1.0, 2.0),
                    T.SigmoidTransform(),
                    T.AffineTransform(-1.0, 3.0),
                ]
            ),
            real(5),
        )
    )
    add(
        _case(
            "IndependentTransform(Exp, 1)",
            T.IndependentTransform(T.ExpTransform(), 1),
            real(4),
        )
    )
    # What HMC uses: biject_to(constraint).
    constrained = [
        ("positive", C.positive, real(5), True),
        ("unit_interval", C.unit_interval, real(5), True),
        ("interval(-1, 3)", C.interval(-1.0, 3.0), real(5), True),
        ("greater_than(2)", C.greater_than(2.0), real(5), True),
        ("less_than(-1)", C.less_than(-1.0), real(5), True),
        ("softplus_positive", C.softplus_positive, real(5), True),
        ("circular", C.circular, real(5), True),
        ("real_vector", C.real_vector, real(4), True),
        ("simplex", C.simplex, real(3), False),
        ("ordered_vector", C.ordered_vector, real(4), True),
        ("positive_ordered_vector", C.positive_ordered_vector, real(4), True),
        ("lower_cholesky", C.lower_cholesky, real(6), False),
        ("scaled_unit_lower_cholesky", C.scaled_unit_lower_cholesky, real(6), False),
        ("softplus_lower_cholesky", C.softplus_lower_cholesky, real(6), False),
        ("corr_cholesky", C.corr_cholesky, real(3), False),
        ("corr_matrix", C.corr_matrix, real(3), False),
        ("positive_definite", C.positive_definite, real(6), False),
        ("l1_ball", C.l1_ball, real(4), False),
        ("zero_sum", C.zero_sum, real(4), False),
    ]
    for label, constraint, sample, square in constrained:
        name = f"biject_to({label})"
        try:
            add(_case(name, biject_to(constraint), sample, square))
        except Exception as e:  # noqa: BLE001 - not registered in this version
            add(unavailable("numpyro", name, e))
    # Inverses of the vector transforms (x on the constrained side).
    add(_case("OrderedTransform().inv", T.OrderedTransform().inv, ordered(5)))
    add(
        _case(
            "StickBreakingTransform().inv",
            T.StickBreakingTransform().inv,
            simplex(4),
            False,
        )
    )
    add(
        _case(
            "LowerCholeskyTransform().inv",
            T.LowerCholeskyTransform().inv,
            lower_cholesky(3),
            False,
        )
    )
    add(
        _case(
            "CorrCholeskyTransform().inv",
            T.CorrCholeskyTransform().inv,
            corr_cholesky(3),
            False,
        )
    )
    add(
        _case(
            "ScaledUnitLowerCholeskyTransform().inv",
            T.ScaledUnitLowerCholeskyTransform().inv,
            unit_lower(3),
            False,
        )
    )
    add(
        _case(
            "biject_to(positive_ordered_vector).inv",
            biject_to(C.positive_ordered_vector).inv,
            positive_ordered(4),
        )
    )
    add(_case("L1BallTransform().inv", T.L1BallTransform().inv, l1_ball(4), False))
    add(_case("ZeroSumTransform(1).inv", T.ZeroSumTransform(1).inv, zero_sum(4), False))
    # A flow: inverse autoregressive, with a small fixed MADE network.
    add(_iaf_case(InverseAutoregressiveTransform))
    return out


def _iaf_case(iaf: Any) -> Case:
    """`InverseAutoregressiveTransform` with a fixed lower-triangular 'network'.

    Its forward `y = exp(log_scale(x)) * x + mean(x)` uses `x` in its own
    shift and scale: inverting it takes a solve dimension by dimension.
    """
    rng = params_rng("iaf")
    n = 4
    w_mean = jnp.asarray(np.tril(rng.uniform(-1, 1, (n, n)), -1), jnp.float32)
    w_scale = jnp.asarray(np.tril(rng.uniform(-0.5, 0.5, (n, n)), -1), jnp.float32)

    def arn(x: Any) -> Any:
        return x @ w_mean.T, jnp.tanh(x @ w_scale.T)

    return _case(
        "InverseAutoregressiveTransform(masked linear mean, tanh log_scale)",
        iaf(arn),
        real(n),
    )
