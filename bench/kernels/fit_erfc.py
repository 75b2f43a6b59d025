"""bench/kernels/fit_erfc.py: the erfc fit of tensor/kernels_math.c
(ERFC_P, used by GELU's erf form and its backward).

erfc(z) = t * exp(P(s) - z^2), with t = 1/(1 + z/2) and
s = (t - 0.58)/0.42 in [-1.38, 1] for z in [0, 10.5]: P, of degree 11, is
fitted to log(erfc(z)/t) + z^2 by least squares on 400,001 evenly spaced
z, reweighted 40 times towards the largest errors (towards minimax). It
prints the maximum error of P in float64 and of its float32 evaluation
with the float32 coefficients, and the coefficients as ERFC_P lists them
(highest degree first, float32 hexadecimal).

Usage: /usr/bin/python3 bench/kernels/fit_erfc.py   (needs python3-numpy)
"""

import math

import numpy as np

z = np.linspace(0, 10.5, 400001)
t = 1 / (1 + 0.5 * z)
target = np.log(np.array([math.erfc(v) for v in z]) / t) + z * z
a, b = 0.58, 0.42
s = (t - a) / b
deg = 11
w = np.ones_like(s)
for _ in range(40):
    c = np.polynomial.polynomial.polyfit(s, target, deg, w=w)
    err = np.polynomial.polynomial.polyval(s, c) - target
    w = w * (1 + 10 * np.abs(err) / np.max(np.abs(err)))
    w /= w.max()
print("max error, float64:", np.max(np.abs(err)))
c32 = c.astype(np.float32)
s32 = ((t.astype(np.float32) - np.float32(a)) / np.float32(b)).astype(np.float32)
p = np.float32(0)
for v in c32[::-1]:
    p = (p * s32 + v).astype(np.float32)
print("max error, float32 evaluation:", np.max(np.abs(p.astype(np.float64) - target)))
print(", ".join("%sf" % float(v).hex().replace("0000000p", "p") for v in c32[::-1]))
