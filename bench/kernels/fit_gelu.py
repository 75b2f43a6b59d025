"""bench/kernels/fit_gelu.py: the coefficients of gelu_erf_f32 in
tensor/kernels_math.c (GELU_E, GELU_N, GELU_D: GELU's erf form).

gelu_erf_f32 computes Φ(-a), a = |x|, as K·e^(-a²/2)·D(a)/(a·D(a) + N(a)),
K = 1/√(2π). That is Φ(-a) = K·e^(-a²/2)/(a + h(a)) with h = N/D (h is
√(π/2) at 0 and falls like 1/a: Laplace's continued fraction for Mills'
ratio), so an error in h costs only its share h/(a + h) of the result,
and D's rounding errors cancel between numerator and denominator.

- GELU_E, K·e^r on |r| ≤ ln2/2 (a little more, for the rounding of the
  reduction): degree 6, its constant term K rounded to float32 (K32) and
  the rest fitted to K32·e^r, relative error, towards minimax (Lawson's
  reweighted least squares).
- GELU_N, GELU_D: h ≈ N/D, N of degree 4 with N(0) = 2·K32 (so Φ(0) is
  exactly ½), D of degree 4 with D(0) = 1 (other degrees: arguments), fitted to K32/R(a) − a with
  R(a) = Φ(-a)·e^(a²/2) (mpmath, 30 digits) on a ∈ [0, 16.265625], the
  error weighted by 1/(a + h) (the relative error it causes in Φ) and
  relaxed beyond a = 13.2 (where x·Φ(-a) is subnormal and each further
  unit of a²/2·log2(e) allows twice the relative error), linearised as
  N − h·D and iterated (Sanathanan–Koerner), then reweighted towards
  minimax.

Each table's float32 coefficients are rounded one at a time, highest
degree first, the remaining ones refitted each time. The script prints
each fit's largest error in float64 and with the float32 coefficients
(evaluated in float64), and the C tables, highest degree first.

Usage: /usr/bin/python3 bench/kernels/fit_gelu.py [NDEG DDEG]   (about a minute)
(needs python3-numpy and python3-mpmath).
"""

import math
import sys

import mpmath
import numpy as np

f32 = np.float32
CLAMP = 16.265625
K32 = float(f32(1 / math.sqrt(2 * math.pi)))


def hexf(v):
    s = float(f32(v)).hex()
    m, e = s.split("p")
    m = m.rstrip("0").rstrip(".") if "." in m else m
    return m + "p" + e + "f"


def lawson(A, b, scale, fixed_rounds, iters=300):
    """Solve min max |A c - b| / scale by reweighted least squares; with
    fixed_rounds, coefficients are rounded to float32 one at a time from
    the last column, refitting the others."""
    n = A.shape[1]
    fixed = {}

    def solve():
        free = [j for j in range(n) if j not in fixed]
        bb = b - sum((A[:, j] * v for j, v in fixed.items()), np.zeros_like(b))
        w = np.ones_like(b)
        best = None
        for _ in range(iters):
            W = np.sqrt(w) / scale
            c, *_ = np.linalg.lstsq(A[:, free] * W[:, None], bb * W, rcond=None)
            err = (A[:, free] @ c - bb) / scale
            e = np.max(np.abs(err))
            if best is None or e < best[0]:
                best = (e, c)
            w = w * (np.abs(err) / e) ** 0.5 + 1e-300
            w /= w.sum()
        full = np.zeros(n)
        for j, v in fixed.items():
            full[j] = v
        full[free] = best[1]
        return best[0], full

    e64, c = solve()
    if fixed_rounds:
        for j in reversed(range(n)):
            fixed[j] = float(f32(c[j]))
            if len(fixed) < n:
                _, c = solve()
        c = np.array([fixed[j] for j in range(n)])
    return e64, c


def fit_exp(deg=6):
    L = 0.3466 * 1.01
    r = np.linspace(-L, L, 20001)
    T = K32 * np.exp(r)
    # p(r) = K32 + r·(c1 + c2 r + ...): fit the rest with K32 fixed
    A = np.vander(r, deg + 1, increasing=True)[:, 1:]
    e64, c = lawson(A / L ** 0, T - K32, T, True)
    coef = np.concatenate([[K32], c])
    e32 = np.max(np.abs(np.polynomial.polynomial.polyval(r, coef) / T - 1))
    return e64, e32, coef


def fit_rational(nd, dd, A1=13.2):
    a = np.linspace(0, CLAMP, 60001).astype(f32).astype(np.float64)
    mpmath.mp.dps = 30
    R = np.array([float(mpmath.erfc(mpmath.mpf(v) / mpmath.sqrt(2)) * mpmath.exp(mpmath.mpf(v) ** 2 / 2) / 2) for v in a])
    H = K32 / R - a
    tol = np.where(a <= A1, 1.0, np.exp2(np.minimum((a * a - A1 * A1) / 2 * math.log2(math.e), 60)))
    scale0 = (a + H) * tol
    u = a / CLAMP  # monomials in u for conditioning; rescaled at the end
    Vn = np.vander(u, nd + 1, increasing=True)
    Vd = np.vander(u, dd + 1, increasing=True)
    D = np.ones_like(a)
    # N(u) − H·D(u) = 0 with N(0) = 2·K32, D(0) = 1: unknowns n1.., d1..
    for _ in range(30):  # Sanathanan–Koerner
        A = np.hstack([Vn[:, 1:], -Vd[:, 1:] * H[:, None]])
        b = H - 2 * K32
        e64, c = lawson(A, b, scale0 * D, False, iters=100)
        D = 1 + Vd[:, 1:] @ c[nd:]
    n = np.concatenate([[2 * K32], c[:nd]]) / CLAMP ** np.arange(nd + 1)
    d = np.concatenate([[1.0], c[nd:]]) / CLAMP ** np.arange(dd + 1)
    # round to float32, highest degree first, refitting the rest (in a)
    Vn = np.vander(a, nd + 1, increasing=True)
    Vd = np.vander(a, dd + 1, increasing=True)
    A = np.hstack([Vn[:, 1:], -Vd[:, 1:] * H[:, None]])
    b = H - 2 * K32
    D = Vd @ d
    order = []
    for k in range(max(nd, dd), 0, -1):
        if k <= dd:
            order.append(nd + k - 1)
        if k <= nd:
            order.append(k - 1)
    c = np.concatenate([n[1:], d[1:]])
    fixed = {}
    for j in order:
        fixed[j] = float(f32(c[j]))
        free = [i for i in range(len(c)) if i not in fixed]
        if not free:
            break
        bb = b - sum((A[:, i] * v for i, v in fixed.items()), np.zeros_like(b))
        w = np.ones_like(b)
        best = None
        for _ in range(100):
            W = np.sqrt(w) / (scale0 * D)
            s, *_ = np.linalg.lstsq(A[:, free] * W[:, None], bb * W, rcond=None)
            err = (A[:, free] @ s - bb) / (scale0 * D)
            e = np.max(np.abs(err))
            if best is None or e < best[0]:
                best = (e, s)
            w = w * (np.abs(err) / e) ** 0.5 + 1e-300
            w /= w.sum()
        c[free] = best[1]
    c = np.array([fixed[j] for j in range(len(c))])
    n = np.concatenate([[2 * K32], c[:nd]])
    d = np.concatenate([[1.0], c[nd:]])
    hN = np.polynomial.polynomial.polyval(a, n)
    hD = np.polynomial.polynomial.polyval(a, d)
    e32 = np.max(np.abs((hN / hD - H) / scale0))
    return e64, e32, n, d, hD.min()


def main():
    nd, dd = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (4, 4)
    e64, e32, p = fit_exp()
    print("// K·e^r, degree %d: max relative error %.3g (float64), %.3g (float32 coefficients)" % (len(p) - 1, e64, e32))
    print("static const float GELU_E[%d] = {%s};" % (len(p), ", ".join(hexf(v) for v in p[::-1])))
    e64, e32, n, d, dmin = fit_rational(nd, dd)
    print("// h = N/D, degrees %d/%d: max error share %.3g (float64), %.3g (float32 coefficients); min D %.3g" % (nd, dd, e64, e32, dmin))
    print("static const float GELU_N[%d] = {%s};" % (nd + 1, ", ".join(hexf(v) for v in n[::-1])))
    print("static const float GELU_D[%d] = {%s};" % (dd + 1, ", ".join(hexf(v) for v in d[::-1])))


if __name__ == "__main__":
    main()
