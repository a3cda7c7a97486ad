"""TensorFlow Probability's bijectors, JAX substrate, as cases.

TFP's conventions: `b.forward(x)`, `b.inverse(y)` and
`b.inverse_log_det_jacobian(y, event_ndims=...)`; the reference ildj takes
every dimension of each part of `y` as an event dimension (one scalar), and
sums the parts. TFP caches `forward`/`inverse` pairs by array
identity, so the harness hands the library a fresh copy of `y`, never the
array `forward` returned.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _common import (
    Case,
    fmt,
    invertible_lower,
    lower_cholesky,
    ordered,
    params_rng,
    positive,
    real,
    seq,
    simplex,
    sum_leaves,
    unit,
    well_conditioned,
)


def _case(name: str, b: Any, sample: Any, square: bool = True, note: str = "") -> Case:
    def ildj(y: Any) -> Any:
        # Every dimension is an event dimension: one scalar for the whole `y`.
        ndims = jax.tree_util.tree_map(jnp.ndim, y)
        return sum_leaves(b.inverse_log_det_jacobian(y, event_ndims=ndims))

    return Case("tfp", name, b.forward, b.inverse, ildj, sample, square, note)


def cases() -> list[Case]:
    from tensorflow_probability.substrates import jax as tfp

    tfb = tfp.bijectors
    out: list[Case] = []
    add = out.append
    rng = params_rng("tfp")

    def one(label: str, b: Any, sample: Any, square: bool = True) -> None:
        add(_case(label, b, sample, square))

    # Scalar bijectors, parameter-free.
    one("Exp()", tfb.Exp(), real(5))
    one("Expm1()", tfb.Expm1(), real(5))
    one("Log()", tfb.Log(), positive(5))
    one("Log1p()", tfb.Log1p(), real(5, low=-0.9))
    one("Identity()", tfb.Identity(), real(5))
    one("Sigmoid()", tfb.Sigmoid(), real(5, low=-5, high=5))
    one("Tanh()", tfb.Tanh(), real(5))
    one("Sinh()", tfb.Sinh(), real(5))
    one("Softsign()", tfb.Softsign(), real(5, low=-4, high=4))
    one("Softplus()", tfb.Softplus(), real(5, low=-4, high=4))
    one("Square()", tfb.Square(), positive(5))
    one("Reciprocal()", tfb.Reciprocal(), positive(5))
    one("NormalCDF()", tfb.NormalCDF(), real(5, low=-3, high=3))
    abs_b = tfb.AbsoluteValue()
    add(
        Case(
            "tfp",
            "AbsoluteValue() (inverse: the x >= 0 preimage)",
            abs_b.forward,
            lambda y: abs_b.inverse(y)[1],
            lambda y: jnp.sum(
                jnp.zeros_like(y) + abs_b.inverse_log_det_jacobian(y, event_ndims=0)[1]
            ),
            positive(5),
        )
    )
    # Scalar bijectors with parameters.
    one("Sigmoid(low=-2, high=3)", tfb.Sigmoid(low=-2.0, high=3.0), real(5, low=-4))
    one("Softplus(hinge_softness=0.5)", tfb.Softplus(hinge_softness=0.5), real(5))
    one("Softplus(low=1.0)", tfb.Softplus(low=1.0), real(5))
    one("SoftClip(low=-1, high=2)", tfb.SoftClip(low=-1.0, high=2.0), real(5))
    one(
        "SoftClip(low=0, high=1, hinge_softness=0.3)",
        tfb.SoftClip(low=0.0, high=1.0, hinge_softness=0.3),
        real(5),
    )
    one("SoftClip(low=0)", tfb.SoftClip(low=0.0), real(5))
    one("Softfloor(temperature=0.5)", tfb.Softfloor(temperature=0.5), real(5))
    one("Softfloor(temperature=0.05)", tfb.Softfloor(temperature=0.05), real(5))
    for p in (3.0, 0.5, -2.0):
        one(f"Power({p})", tfb.Power(p), positive(5))
    one("PowerTransform(0.5)", tfb.PowerTransform(0.5), real(5, low=-1.5))
    one("PowerTransform(0.0)", tfb.PowerTransform(0.0), real(5))
    one("Scale(2.5)", tfb.Scale(2.5), real(5))
    scale = jnp.array([0.5, -2.0, 3.0, 1.0, -0.25])
    one(f"Scale({fmt(scale)})", tfb.Scale(scale), real(5))
    one("Scale(log_scale=-0.3)", tfb.Scale(log_scale=-0.3), real(5))
    one("Shift(1.5)", tfb.Shift(1.5), real(5))
    for skew, tail in [(0.5, 2.0), (-1.0, 0.5)]:
        one(
            f"SinhArcsinh(skewness={skew}, tailweight={tail})",
            tfb.SinhArcsinh(skewness=skew, tailweight=tail),
            real(5),
        )
    one(
        "LambertWTail(shift=0.5, scale=2, tailweight=0.2)",
        tfb.LambertWTail(shift=0.5, scale=2.0, tailweight=0.2),
        real(5),
    )
    one("GumbelCDF(loc=1, scale=2)", tfb.GumbelCDF(loc=1.0, scale=2.0), real(5))
    one("MoyalCDF(loc=0.5, scale=1.5)", tfb.MoyalCDF(loc=0.5, scale=1.5), real(5))
    one(
        "FrechetCDF(loc=0, scale=1, concentration=2)",
        tfb.FrechetCDF(loc=0.0, scale=1.0, concentration=2.0),
        positive(5, low=0.5),
    )
    for c in (0.3, -0.3, 0.0):
        one(
            f"GeneralizedExtremeValueCDF(loc=0, scale=1, concentration={c})",
            tfb.GeneralizedExtremeValueCDF(loc=0.0, scale=1.0, concentration=c),
            real(5),
        )
    for c in (0.5, -0.5):
        one(
            f"GeneralizedPareto(loc=1, scale=2, concentration={c})",
            tfb.GeneralizedPareto(loc=1.0, scale=2.0, concentration=c),
            real(5),
        )
    one(
        "GompertzCDF(concentration=0.5, rate=1.5)",
        tfb.GompertzCDF(concentration=0.5, rate=1.5),
        positive(5, high=2.0),
    )
    one(
        "ShiftedGompertzCDF(concentration=0.7, rate=1)",
        tfb.ShiftedGompertzCDF(concentration=0.7, rate=1.0),
        positive(5),
    )
    one(
        "KumaraswamyCDF(concentration1=2, concentration0=3)",
        tfb.KumaraswamyCDF(concentration1=2.0, concentration0=3.0),
        unit(5),
    )
    one("RayleighCDF(scale=1.5)", tfb.RayleighCDF(scale=1.5), positive(5))
    one(
        "WeibullCDF(scale=2, concentration=1.5)",
        tfb.WeibullCDF(scale=2.0, concentration=1.5),
        positive(5),
    )
    # Inverted scalar bijectors.
    one("Invert(Exp())", tfb.Invert(tfb.Exp()), positive(5))
    one("Invert(Softplus())", tfb.Invert(tfb.Softplus()), positive(5))
    one("Invert(Sigmoid())", tfb.Invert(tfb.Sigmoid()), unit(5))
    one("Invert(NormalCDF())", tfb.Invert(tfb.NormalCDF()), unit(5))
    one("Invert(Tanh())", tfb.Invert(tfb.Tanh()), unit(5, low=-0.9))
    one(
        "Invert(KumaraswamyCDF(2, 3))",
        tfb.Invert(tfb.KumaraswamyCDF(2.0, 3.0)),
        unit(5),
    )
    # Chains.
    one(
        "Chain([Exp(), Scale(2), Shift(1)])",
        tfb.Chain([tfb.Exp(), tfb.Scale(2.0), tfb.Shift(1.0)]),
        real(5),
    )
    one(
        "Chain([Shift(-1), Scale(4), Sigmoid()])",
        tfb.Chain([tfb.Shift(-1.0), tfb.Scale(4.0), tfb.Sigmoid()]),
        real(5),
    )
    one(
        "Chain([Softplus(), SinhArcsinh(0.3, 1.5)])",
        tfb.Chain([tfb.Softplus(), tfb.SinhArcsinh(0.3, 1.5)]),
        real(5),
    )
    # Vector bijectors.
    n = 4
    m = well_conditioned(n, rng)
    one("Ascending()", tfb.Ascending(), real(5))
    one("Invert(Ascending())", tfb.Invert(tfb.Ascending()), ordered(5))
    one("Cumsum()", tfb.Cumsum(), real(5))
    perm = jnp.array([2, 0, 3, 1])
    one(f"Permute({fmt(perm)})", tfb.Permute(perm), real(n))
    axis = jnp.asarray(rng.normal(size=n), jnp.float32)
    one(
        "Householder(reflection_axis)",
        tfb.Householder(axis / jnp.linalg.norm(axis)),
        real(n),
    )
    diag = jnp.array([0.5, 2.0, -1.5, 3.0])
    one(f"ScaleMatvecDiag({fmt(diag)})", tfb.ScaleMatvecDiag(diag), real(n))
    tril = jnp.tril(m)
    one(f"ScaleMatvecTriL(tril(M)={fmt(tril)})", tfb.ScaleMatvecTriL(tril), real(n))
    one(
        "ScaleMatvecTriL(tril(M), adjoint=True)",
        tfb.ScaleMatvecTriL(tril, adjoint=True),
        real(n),
    )
    perm_lu = jnp.array([1, 0, 3, 2])
    one(
        f"ScaleMatvecLU(lower_upper=M, permutation={fmt(perm_lu)})",
        tfb.ScaleMatvecLU(m, perm_lu),
        real(n),
    )
    one(
        "ScaleMatvecLinearOperator(LinearOperatorFullMatrix(M))",
        tfb.ScaleMatvecLinearOperator(tfp.tf2jax.linalg.LinearOperatorFullMatrix(m)),
        real(n),
    )
    one(
        "ScaleMatvecLinearOperator(LinearOperatorLowerTriangular(tril(M)))",
        tfb.ScaleMatvecLinearOperator(
            tfp.tf2jax.linalg.LinearOperatorLowerTriangular(tril)
        ),
        real(n),
    )
    one("Transpose(perm=[1, 0])", tfb.Transpose(perm=[1, 0]), real(2, 3))
    one(
        "Reshape(event_shape_out=[2, 3], event_shape_in=[6])",
        tfb.Reshape(event_shape_out=[2, 3], event_shape_in=[6]),
        real(6),
    )
    one("TransformDiagonal(Exp())", tfb.TransformDiagonal(tfb.Exp()), real(3, 3))
    one("Pad(paddings=[[0, 1]])", tfb.Pad(paddings=[[0, 1]]), real(n), False)
    one("SoftmaxCentered()", tfb.SoftmaxCentered(), real(3), False)
    one(
        "Invert(SoftmaxCentered())",
        tfb.Invert(tfb.SoftmaxCentered()),
        simplex(4),
        False,
    )
    one("IteratedSigmoidCentered()", tfb.IteratedSigmoidCentered(), real(3), False)
    one("UnitVector()", tfb.UnitVector(), real(3), False)
    one("FillTriangular()", tfb.FillTriangular(), real(6), False)
    one("FillTriangular(upper=True)", tfb.FillTriangular(upper=True), real(6), False)
    one("FillScaleTriL()", tfb.FillScaleTriL(), real(6), False)
    one("CorrelationCholesky()", tfb.CorrelationCholesky(), real(3), False)
    one("CholeskyOuterProduct()", tfb.CholeskyOuterProduct(), lower_cholesky(3), False)
    one(
        "CholeskyToInvCholesky()", tfb.CholeskyToInvCholesky(), lower_cholesky(3), False
    )
    one("MatrixInverseTriL()", tfb.MatrixInverseTriL(), invertible_lower(3), False)
    # Structured bijectors.
    one(
        "Blockwise([Exp(), Sigmoid()], block_sizes=[2, 3])",
        tfb.Blockwise([tfb.Exp(), tfb.Sigmoid()], block_sizes=[2, 3]),
        real(5),
    )
    one("Split([2, 3])", tfb.Split([2, 3]), real(5))
    one(
        "JointMap([Exp(), Softplus()])",
        tfb.JointMap([tfb.Exp(), tfb.Softplus()]),
        seq(real(2), real(3)),
    )
    one(
        "Restructure({'a': 0, 'b': 1})",
        tfb.Restructure({"a": 0, "b": 1}),
        seq(real(2), real(3)),
    )
    # Splines.
    for bins, lo in [(4, -3.0), (6, -1.0)]:
        widths = jnp.asarray(rng.dirichlet(np.full(bins, 3.0)) * -2 * lo, jnp.float32)
        heights = jnp.asarray(rng.dirichlet(np.full(bins, 3.0)) * -2 * lo, jnp.float32)
        slopes = jnp.asarray(rng.uniform(0.3, 3.0, bins - 1), jnp.float32)
        one(
            f"RationalQuadraticSpline({bins} bins, range_min={lo})",
            tfb.RationalQuadraticSpline(widths, heights, slopes, range_min=lo),
            real(5, low=lo * 1.3, high=-lo * 1.3),
        )
    # Flows with small fixed conditioners.
    w = jnp.asarray(rng.uniform(-1, 1, (2, 2)), jnp.float32)

    def shift_and_log_scale(x0: Any, output_units: int, **_: Any) -> Any:
        h = jnp.tanh(x0 @ w[:, :output_units])
        return h, 0.5 * h

    one(
        "RealNVP(num_masked=2, affine conditioner)",
        tfb.RealNVP(num_masked=2, shift_and_log_scale_fn=shift_and_log_scale),
        real(n),
    )
    w_low = jnp.asarray(np.tril(rng.uniform(-1, 1, (n, n)), -1), jnp.float32)

    def autoregressive(y: Any) -> Any:
        h = y @ w_low.T  # output i sees only y[:i]
        return jnp.tanh(h), 0.3 * jnp.tanh(h)

    maf = tfb.MaskedAutoregressiveFlow(shift_and_log_scale_fn=autoregressive)
    one("MaskedAutoregressiveFlow(masked linear)", maf, real(n))
    one("Invert(MaskedAutoregressiveFlow(masked linear))", tfb.Invert(maf), real(n))
    return out
