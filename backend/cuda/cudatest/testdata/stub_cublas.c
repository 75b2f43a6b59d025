// A stub libcublas for memsh's tests: handles and cublasSgemm_v2, computed
// on the CPU. Like the real library it works in the context current on the
// calling thread: it asks the stub libcuda.so.1 ($MEMSH_STUB_LIBCUDA, already
// loaded by the test) for it, and checks that every matrix lies in a live
// device allocation.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, EXECUTION_FAILED = 13 };

struct handle {
	int magic;
	int dev;
};

static int (*current)(void);
static int (*check_range)(uintptr_t, size_t);

static int bind(void) {
	if (current)
		return 1;
	const char *path = getenv("MEMSH_STUB_LIBCUDA");
	if (!path)
		return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return 0;
	current = (int (*)(void))dlsym(h, "stub_current");
	check_range = (int (*)(uintptr_t, size_t))dlsym(h, "stub_check_range");
	return current && check_range;
}

static int sgemm_calls, fail_status;
static int last_args[8];

int stub_blas_calls(void) { return sgemm_calls; }

// stub_blas_last copies the last Sgemm's transa, transb, m, n, k, lda, ldb,
// ldc.
void stub_blas_last(int *args) { memcpy(args, last_args, sizeof last_args); }

void stub_blas_fail(int status) { fail_status = status; }

int cublasCreate_v2(struct handle **h) {
	if (!bind() || current() < 0)
		return NOT_INITIALIZED;
	struct handle *x = malloc(sizeof *x);
	x->magic = 0xb1a5;
	x->dev = current();
	*h = x;
	return OK;
}

int cublasDestroy_v2(struct handle *h) {
	if (!h || h->magic != 0xb1a5)
		return NOT_INITIALIZED;
	h->magic = 0;
	free(h);
	return OK;
}

int cublasGetVersion_v2(struct handle *h, int *v) {
	(void)h;
	*v = 120402;
	return OK;
}

// cublasSgemm_v2: C = alpha op(A) op(B) + beta C, column-major.
int cublasSgemm_v2(struct handle *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc) {
	if (!h || h->magic != 0xb1a5)
		return NOT_INITIALIZED;
	if (current() != h->dev)
		return EXECUTION_FAILED; // wrong or no context on this thread
	if (fail_status) {
		int s = fail_status;
		fail_status = 0;
		return s;
	}
	if (m < 0 || n < 0 || k < 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1))
		return INVALID_VALUE;
	int arows = ta ? k : m, acols = ta ? m : k;
	int brows = tb ? n : k, bcols = tb ? k : n;
	if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
		return INVALID_VALUE;
	if ((m && k && !check_range((uintptr_t)A, ((size_t)lda * (acols - 1) + arows) * 4)) ||
	    (k && n && !check_range((uintptr_t)B, ((size_t)ldb * (bcols - 1) + brows) * 4)) ||
	    (m && n && !check_range((uintptr_t)C, ((size_t)ldc * (n - 1) + m) * 4)))
		return INVALID_VALUE;
	sgemm_calls++;
	int args[8] = {ta, tb, m, n, k, lda, ldb, ldc};
	memcpy(last_args, args, sizeof args);
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double s = 0;
			for (int l = 0; l < k; l++) {
				float a = ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda];
				float b = tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb];
				s += (double)a * b;
			}
			float *c = &C[i + (size_t)j * ldc];
			*c = (float)(*alpha * s + (*beta != 0 ? *beta * *c : 0));
		}
	return OK;
}
