// memsh's device kernels.
//
// This one source is compiled two ways:
//   - to PTX for NVIDIA GPUs (kernels.ptx, embedded in the memsh binary and
//     loaded with cuModuleLoadDataEx), by `go generate` in backend/cuda:
//       clang -x cuda --cuda-device-only -nocudainc -nocudalib
//             --cuda-gpu-arch=sm_52 -O2 -ffp-contract=off -S
//   - as plain C into the stub libcuda.so.1 the tests build (cudatest), whose
//     cuLaunchKernel runs the kernels on the CPU, so that `go test` checks
//     what the kernels compute on a machine without a GPU.
//
// Rules that keep both builds computing the same bits as memsh's CPU
// kernels (starlib/tensor):
//   - no fused multiply-add (-ffp-contract=off), no flush-to-zero, no
//     approximate instructions: every + - * / sqrt is one IEEE operation,
//     rounded to nearest even;
//   - float16 / bfloat16 are converted with integer code ported from
//     starlib/tensor/kernels_convert.go, not hardware conversions;
//   - the random generator is Philox-4x32-10 with the value layout of
//     starlib/tensor/kernels_random.go; the normal draw uses ports of Go's
//     math.Log (amd64) and math.Cos in float64.
//
// Every kernel parameter is 8 bytes (u64, double or a pointer), so a launch
// passes one array of 8-byte words. Kernels use grid-stride loops, so any
// grid size is correct.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

#if defined(__CUDA__)
#define KERNEL extern "C" __attribute__((global)) void
#define DEVFN static __attribute__((device)) inline
#define GID ((u64)__nvvm_read_ptx_sreg_ctaid_x() * (u64)__nvvm_read_ptx_sreg_ntid_x() + (u64)__nvvm_read_ptx_sreg_tid_x())
#define GSTRIDE ((u64)__nvvm_read_ptx_sreg_nctaid_x() * (u64)__nvvm_read_ptx_sreg_ntid_x())
#else
// The host build: the stub's launcher sets the block and thread of each
// emulated thread before calling a kernel.
static __thread u64 kt_block, kt_nblocks, kt_tid, kt_ntid;
#define KERNEL static void
#define DEVFN static inline
#define GID (kt_block * kt_ntid + kt_tid)
#define GSTRIDE (kt_nblocks * kt_ntid)
#endif

// dtype codes (backend/cuda DType)
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_F64 3

// binary ops (backend/cuda BinaryOp)
#define OP_ADD 0
#define OP_SUB 1
#define OP_MUL 2
#define OP_DIV 3

// unary ops (backend/cuda UnaryOp)
#define U_NEG 0
#define U_ABS 1
#define U_RELU 2
#define U_SQRT 3

DEVFN u32 f2u(float f) {
	u32 u;
	__builtin_memcpy(&u, &f, 4);
	return u;
}
DEVFN float u2f(u32 u) {
	float f;
	__builtin_memcpy(&f, &u, 4);
	return f;
}
DEVFN u64 d2u(double d) {
	u64 u;
	__builtin_memcpy(&u, &d, 8);
	return u;
}
DEVFN double u2d(u64 u) {
	double d;
	__builtin_memcpy(&d, &u, 8);
	return d;
}

// f32_to_f16 is tensor's f32ToF16: round to nearest even, NaN kept quiet.
DEVFN u16 f32_to_f16(float f) {
	u32 b = f2u(f);
	u16 sign = (u16)((b >> 16) & 0x8000);
	int exp = (int)((b >> 23) & 0xff);
	u32 mant = b & 0x7fffff;
	if (exp == 0xff) {
		if (mant != 0)
			return sign | 0x7e00;
		return sign | 0x7c00;
	}
	int e = exp - 127 + 15;
	if (e >= 0x1f)
		return sign | 0x7c00;
	if (e <= 0) {
		if (e < -10)
			return sign;
		mant |= 0x800000;
		u32 shift = (u32)(14 - e);
		u32 h = mant >> shift;
		u32 rem = mant & ((1u << shift) - 1);
		u32 halfway = 1u << (shift - 1);
		if (rem > halfway || (rem == halfway && (h & 1) == 1))
			h++;
		return sign | (u16)h;
	}
	u32 h = ((u32)e << 10) | (mant >> 13);
	u32 rem = mant & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1) == 1))
		h++;
	return sign | (u16)h;
}

// f16_to_f32 is tensor's f16ToF32 (exact).
DEVFN float f16_to_f32(u16 h) {
	u32 sign = (u32)(h & 0x8000) << 16;
	u32 exp = (u32)(h >> 10) & 0x1f;
	u32 mant = (u32)(h & 0x3ff);
	if (exp == 0x1f)
		return u2f(sign | 0x7f800000 | (mant << 13));
	if (exp == 0) {
		float f = (float)mant * (1.0f / 16777216.0f);
		return sign ? -f : f;
	}
	return u2f(sign | ((exp + 112) << 23) | (mant << 13));
}

// f32_to_bf16 is tensor's f32ToBF16.
DEVFN u16 f32_to_bf16(float f) {
	u32 b = f2u(f);
	if (f != f)
		return (u16)(b >> 16) | 0x40;
	return (u16)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

DEVFN float bf16_to_f32(u16 h) { return u2f((u32)h << 16); }

// load32 reads element i of a float32 / float16 / bfloat16 array as float32.
DEVFN float load32(const void *p, u64 i, u64 dt) {
	if (dt == DT_F16)
		return f16_to_f32(((const u16 *)p)[i]);
	if (dt == DT_BF16)
		return bf16_to_f32(((const u16 *)p)[i]);
	return ((const float *)p)[i];
}

// store32 writes v as element i, rounding to a half type.
DEVFN void store32(void *p, u64 i, u64 dt, float v) {
	if (dt == DT_F16)
		((u16 *)p)[i] = f32_to_f16(v);
	else if (dt == DT_BF16)
		((u16 *)p)[i] = f32_to_bf16(v);
	else
		((float *)p)[i] = v;
}

// store64 writes a float64 value as element i of dtype dt, as tensor's
// storeF64 does (through float32 for the half types).
DEVFN void store64(void *p, u64 i, u64 dt, double v) {
	if (dt == DT_F64)
		((double *)p)[i] = v;
	else
		store32(p, i, dt, (float)v);
}

DEVFN double load64(const void *p, u64 i, u64 dt) {
	if (dt == DT_F64)
		return ((const double *)p)[i];
	return (double)load32(p, i, dt);
}

// memsh_fill64: dst[i] = pattern for i < n (8-byte elements; smaller ones
// use cuMemsetD8/16/32).
KERNEL memsh_fill64(u64 n, u64 *dst, u64 pattern) {
	for (u64 i = GID; i < n; i += GSTRIDE)
		dst[i] = pattern;
}

DEVFN float binop32(u64 op, float x, float y) {
	switch (op) {
	case OP_ADD:
		return x + y;
	case OP_SUB:
		return x - y;
	case OP_MUL:
		return x * y;
	}
	return x / y;
}

DEVFN double binop64(u64 op, double x, double y) {
	switch (op) {
	case OP_ADD:
		return x + y;
	case OP_SUB:
		return x - y;
	case OP_MUL:
		return x * y;
	}
	return x / y;
}

// bindex is the element of a broadcast operand read for output element i:
// (i / div) % mod, where div 1 means no division and mod 0 no modulo. A
// contiguous operand of the output's shape is (1, 0); a row of m elements
// repeated over the rows is (1, m); a column repeated over rows of m
// elements is (m, 0); a single element is (1, 1).
DEVFN u64 bindex(u64 i, u64 div, u64 mod) {
	if (div > 1)
		i /= div;
	if (mod)
		i %= mod;
	return i;
}

// memsh_binary: out[i] = a op b for i < n, all of dtype dt. Operand a is
// element bindex(i, a_div, a_mod) of array a, or the number a_num when
// flags bit 0 is set (likewise b, bit 1). Numbers are used in the compute
// type (float32 for the 32- and 16-bit types) without rounding to a half
// type, as the CPU kernels do.
KERNEL memsh_binary(u64 op, u64 dt, u64 n, void *out, const void *a, u64 a_div, u64 a_mod,
                    const void *b, u64 b_div, u64 b_mod, double a_num, double b_num, u64 flags) {
	for (u64 i = GID; i < n; i += GSTRIDE) {
		if (dt == DT_F64) {
			double x = (flags & 1) ? a_num : ((const double *)a)[bindex(i, a_div, a_mod)];
			double y = (flags & 2) ? b_num : ((const double *)b)[bindex(i, b_div, b_mod)];
			((double *)out)[i] = binop64(op, x, y);
		} else {
			float x = (flags & 1) ? (float)a_num : load32(a, bindex(i, a_div, a_mod), dt);
			float y = (flags & 2) ? (float)b_num : load32(b, bindex(i, b_div, b_mod), dt);
			store32(out, i, dt, binop32(op, x, y));
		}
	}
}

DEVFN float unop32(u64 op, float x) {
	switch (op) {
	case U_NEG:
		return -x;
	case U_ABS:
		return x < 0 ? -x : x + 0.0f;
	case U_RELU:
		return (x > 0 || x != x) ? x : 0.0f;
	}
	return (float)__builtin_sqrt((double)x);
}

DEVFN double unop64(u64 op, double x) {
	switch (op) {
	case U_NEG:
		return -x;
	case U_ABS:
		return x < 0 ? -x : x + 0.0;
	case U_RELU:
		return (x > 0 || x != x) ? x : 0.0;
	}
	return __builtin_sqrt(x);
}

// memsh_unary: out[i] = op(in[i]) for i < n, both of dtype dt.
KERNEL memsh_unary(u64 op, u64 dt, u64 n, void *out, const void *in) {
	for (u64 i = GID; i < n; i += GSTRIDE) {
		if (dt == DT_F64)
			((double *)out)[i] = unop64(op, ((const double *)in)[i]);
		else
			store32(out, i, dt, unop32(op, load32(in, i, dt)));
	}
}

// memsh_cast: dst[i] = src[i] converted between float dtypes, as tensor's
// copyKernel does (through float32 unless the source is float64).
KERNEL memsh_cast(u64 n, u64 dst_dt, void *dst, u64 src_dt, const void *src) {
	for (u64 i = GID; i < n; i += GSTRIDE) {
		if (src_dt == DT_F64)
			store64(dst, i, dst_dt, ((const double *)src)[i]);
		else if (dst_dt == DT_F64)
			((double *)dst)[i] = (double)load32(src, i, src_dt);
		else
			store32(dst, i, dst_dt, load32(src, i, src_dt));
	}
}

// memsh_sum_partial: partials[t] = the float64 sum of in[t], in[t+T],
// in[t+2T], ... (T the number of threads), in that order.
KERNEL memsh_sum_partial(u64 dt, u64 n, const void *in, double *partials) {
	u64 t = GID;
	double s = 0;
	for (u64 i = t; i < n; i += GSTRIDE)
		s += load64(in, i, dt);
	partials[t] = s;
}

// Philox-4x32-10.
DEVFN void philox(u32 c[4], u32 k0, u32 k1) {
	for (int r = 0; r < 10; r++) {
		u64 p0 = (u64)0xD2511F53u * c[0];
		u64 p1 = (u64)0xCD9E8D57u * c[2];
		u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
		u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
		u32 n0 = hi1 ^ c[1] ^ k0;
		u32 n2 = hi0 ^ c[3] ^ k1;
		c[0] = n0;
		c[1] = lo1;
		c[2] = n2;
		c[3] = lo0;
		k0 += 0x9E3779B9u;
		k1 += 0xBB67AE85u;
	}
}

// go_log is Go's math.Log as amd64 computes it (math/log_amd64.s) for
// positive normal x, the only inputs the normal draw gives it.
DEVFN double go_log(double x) {
	const double HSqrt2 = 0x1.6a09e667f3bcdp-1;
	const double Ln2Hi = 0x1.62e42feep-1;
	const double Ln2Lo = 0x1.a39ef35793c76p-33;
	const double L1 = 0x1.5555555555593p-1;
	const double L2 = 0x1.999999997fa04p-2;
	const double L3 = 0x1.2492494229359p-2;
	const double L4 = 0x1.c71c51d8e78afp-3;
	const double L5 = 0x1.7466496cb03dep-3;
	const double L6 = 0x1.39a09d078c69fp-3;
	const double L7 = 0x1.2f112df3e5244p-3;
	u64 bits = d2u(x);
	double f1 = u2d((bits & 0x000FFFFFFFFFFFFFull) | 0x3FE0000000000000ull);
	double k = (double)((int)((bits >> 52) & 0x7FF) - 0x3FE);
	if (!(HSqrt2 < f1)) { // CMPSD ..., 5 (not less than)
		k = k - 1.0;
		f1 = f1 * 2.0;
	}
	double f = f1 - 1.0;
	double s = f / (2.0 + f);
	double s2 = s * s;
	double s4 = s2 * s2;
	double t1 = s2 * (((L7 * s4 + L5) * s4 + L3) * s4 + L1);
	double t2 = s4 * ((L6 * s4 + L4) * s4 + L2);
	double R = t1 + t2;
	double hfsq = (0.5 * f) * f;
	double a = s * (hfsq + R);
	double b = k * Ln2Lo;
	return k * Ln2Hi - ((hfsq - (a + b)) - f);
}

// go_cos is Go's math.Cos (math/sin.go) for 0 <= x < 2^29.
DEVFN double go_cos(double x) {
	const double PI4A = 0x1.921fb4p-1;
	const double PI4B = 0x1.4442dp-25;
	const double PI4C = 0x1.8469898cc5170p-49;
	const double FourOverPi = 0x1.45f306dc9c883p+0;
	if (x < 0)
		x = -x;
	u64 j = (u64)(x * FourOverPi);
	double y = (double)j;
	if ((j & 1) == 1) {
		j++;
		y = y + 1.0;
	}
	j &= 7;
	double z = ((x - y * PI4A) - y * PI4B) - y * PI4C;
	int sign = 0;
	if (j > 3) {
		j -= 4;
		sign = !sign;
	}
	if (j > 1)
		sign = !sign;
	double zz = z * z;
	if (j == 1 || j == 2) {
		double p = ((((((0x1.5d8fd1fd19ccdp-33 * zz) + -0x1.ae5e5a9291f5dp-26) * zz + 0x1.71de3567d48a1p-19) * zz +
		              -0x1.a01a019bfdf03p-13) * zz + 0x1.111111110f7d0p-7) * zz + -0x1.5555555555548p-3);
		y = z + (z * zz) * p;
	} else {
		double p = ((((((-0x1.8fa49a0861a9bp-37 * zz) + 0x1.1ee9d7b4e3f05p-29) * zz + -0x1.27e4f7eac4bc6p-22) * zz +
		              0x1.a01a019c844f5p-16) * zz + -0x1.6c16c16c14f91p-10) * zz + 0x1.555555555554bp-5);
		y = (1.0 - 0.5 * zz) + (zz * zz) * p;
	}
	return sign ? -y : y;
}

// memsh_random: out[i] = the generator's value at offset+i for i < n (see
// starlib/tensor/kernels_random.go): uniform in [0, 1) or standard normal.
KERNEL memsh_random(u64 dt, u64 n, void *out, u64 seed, u64 offset, u64 normal) {
	for (u64 i = GID; i < n; i += GSTRIDE) {
		u64 k = offset + i;
		u32 c[4] = {(u32)k, (u32)(k >> 32), 0, 0};
		philox(c, (u32)seed, (u32)(seed >> 32));
		u64 hi = (((u64)c[0] << 32) | c[1]) >> 11;
		if (normal) {
			double u1 = 1.0 - (double)hi * 0x1p-53;
			double u2 = (double)((((u64)c[2] << 32) | c[3]) >> 11) * 0x1p-53;
			double z = __builtin_sqrt(-2.0 * go_log(u1)) * go_cos(0x1.921fb54442d18p+2 * u2);
			store64(out, i, dt, z);
			continue;
		}
		if (dt == DT_F64)
			((double *)out)[i] = (double)hi * 0x1p-53;
		else if (dt == DT_F16)
			((u16 *)out)[i] = f32_to_f16((float)(c[0] >> 21) * 0x1p-11f);
		else if (dt == DT_BF16)
			((u16 *)out)[i] = f32_to_bf16((float)(c[0] >> 24) * 0x1p-8f);
		else
			((float *)out)[i] = (float)(c[0] >> 8) * 0x1p-24f;
	}
}

// memsh_math_check: the math ports, for tests: logs[i] = go_log(x[i]),
// coss[i] = go_cos(x[i]).
KERNEL memsh_math_check(u64 n, const double *x, double *logs, double *coss) {
	for (u64 i = GID; i < n; i += GSTRIDE) {
		logs[i] = go_log(x[i]);
		coss[i] = go_cos(x[i]);
	}
}

#if !defined(__CUDA__)
// The host build's kernel table: each entry unpacks the 8-byte parameter
// words and calls the kernel.
#define P(i) (p[i])
#define PTR(i) ((void *)(unsigned long)p[i])
#define DBL(i) (u2d(p[i]))
static void host_memsh_fill64(const u64 *p) { memsh_fill64(P(0), (u64 *)PTR(1), P(2)); }
static void host_memsh_binary(const u64 *p) {
	memsh_binary(P(0), P(1), P(2), PTR(3), PTR(4), P(5), P(6), PTR(7), P(8), P(9), DBL(10), DBL(11), P(12));
}
static void host_memsh_unary(const u64 *p) { memsh_unary(P(0), P(1), P(2), PTR(3), PTR(4)); }
static void host_memsh_cast(const u64 *p) { memsh_cast(P(0), P(1), PTR(2), P(3), PTR(4)); }
static void host_memsh_sum_partial(const u64 *p) { memsh_sum_partial(P(0), P(1), PTR(2), (double *)PTR(3)); }
static void host_memsh_random(const u64 *p) { memsh_random(P(0), P(1), PTR(2), P(3), P(4), P(5)); }
static void host_memsh_math_check(const u64 *p) {
	memsh_math_check(P(0), (const double *)PTR(1), (double *)PTR(2), (double *)PTR(3));
}

struct host_kernel {
	const char *name;
	int nparams;
	void (*fn)(const u64 *);
};

static const struct host_kernel host_kernels[] = {
	{"memsh_fill64", 3, host_memsh_fill64},
	{"memsh_binary", 13, host_memsh_binary},
	{"memsh_unary", 5, host_memsh_unary},
	{"memsh_cast", 5, host_memsh_cast},
	{"memsh_sum_partial", 4, host_memsh_sum_partial},
	{"memsh_random", 6, host_memsh_random},
	{"memsh_math_check", 4, host_memsh_math_check},
	{0, 0, 0},
};
#endif
