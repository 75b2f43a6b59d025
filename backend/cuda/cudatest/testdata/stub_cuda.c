// A stub libcuda.so.1 for memsh's tests: the CUDA driver API entry points
// memsh calls, emulated on the CPU, so that `go test` exercises the real
// binding path (dlopen, symbol lookup, contexts, errors, kernel launches)
// on a machine without a GPU.
//
//   - Devices: $MEMSH_STUB_GPUS of them (default 2), $MEMSH_STUB_MEM bytes
//     each (default 1 GiB), named "Stub GPU N" with UUID
//     GPU-5354b000-0000-4000-8000-00000000000N; CUDA_VISIBLE_DEVICES is
//     applied as the driver does (indices or UUID prefixes, up to the first
//     invalid entry). $MEMSH_STUB_INIT makes cuInit return that code.
//   - Contexts: a primary context per device, retained with a reference
//     count; retaining it first takes $MEMSH_STUB_CTX bytes (default 64
//     MiB). The current context is per thread: every call that needs one
//     fails with CUDA_ERROR_INVALID_CONTEXT on a thread without it.
//   - Memory: host malloc, filled with 0xA5 (unless $MEMSH_STUB_POISON=0)
//     so that reading memory nobody wrote shows; every device pointer and
//     range a call is given must lie in a live allocation, else
//     CUDA_ERROR_INVALID_VALUE.
//   - Modules: the image must be PTX text; a function exists when the PTX
//     has its .entry and kernels.cu (compiled into this file) has it.
//   - Launches run the kernel on the CPU for every (block, thread) of the
//     grid, and are recorded (name, grid, block, parameter words).
//   - stub_* functions let tests inject errors and read counters.

#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cu"
#include "stub_state.h"

// ---- the driver API

static size_t envsize(const char *name, size_t def) {
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 0) : def;
}

static void set_uuid(unsigned char *u, int i) {
	static const unsigned char base[16] = {0x53, 0x54, 0xb0, 0x00, 0x00, 0x00, 0x40, 0x00,
	                                       0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
	memcpy(u, base, 16);
	u[15] = (unsigned char)i;
}

static void uuid_string(const unsigned char *u, char *s) {
	sprintf(s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4],
	        u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

// parse_visible applies CUDA_VISIBLE_DEVICES to n devices.
static int parse_visible(int n) {
	const char *v = getenv("CUDA_VISIBLE_DEVICES");
	if (!v) {
		for (int i = 0; i < n; i++)
			visible[i] = i;
		return n;
	}
	int count = 0;
	char buf[256];
	strncpy(buf, v, sizeof buf - 1);
	buf[sizeof buf - 1] = 0;
	for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
		while (*tok == ' ')
			tok++;
		int idx = -1;
		if (strncmp(tok, "GPU-", 4) == 0) {
			for (int i = 0; i < n; i++) {
				char s[64];
				uuid_string(devs[i].uuid, s);
				if (strncmp(s, tok, strlen(tok)) == 0) {
					idx = i;
					break;
				}
			}
		} else {
			char *end;
			long x = strtol(tok, &end, 10);
			if (end != tok && *end == 0 && x >= 0 && x < n)
				idx = (int)x;
		}
		if (idx < 0)
			break; // the driver ignores everything from the first invalid entry
		for (int j = 0; j < count; j++)
			if (visible[j] == idx)
				idx = -1;
		if (idx < 0)
			break;
		visible[count++] = idx;
	}
	return count;
}

CUresult cuInit(unsigned flags) {
	ENTER("cuInit");
	if (flags != 0)
		return INVALID_VALUE;
	int code = (int)envsize("MEMSH_STUB_INIT", 0);
	if (code)
		return code;
	pthread_mutex_lock(&mu);
	if (!initialized) {
		int n = (int)envsize("MEMSH_STUB_GPUS", 2);
		if (n > MAXDEV)
			n = MAXDEV;
		size_t total = envsize("MEMSH_STUB_MEM", (size_t)1 << 30);
		ctxbytes = envsize("MEMSH_STUB_CTX", ctxbytes);
		poison = (int)envsize("MEMSH_STUB_POISON", 1);
		for (int i = 0; i < n; i++) {
			snprintf(devs[i].name, sizeof devs[i].name, "Stub GPU %d", i);
			set_uuid(devs[i].uuid, i);
			devs[i].total = total;
			devs[i].ctx.magic = 0x5c7c;
			devs[i].ctx.dev = i;
		}
		ndev = parse_visible(n);
		initialized = 1;
	}
	int nd = ndev;
	pthread_mutex_unlock(&mu);
	return nd == 0 ? NO_DEVICE : SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
	ENTER("cuDriverGetVersion");
	*v = 12040;
	return SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	ENTER("cuDeviceGetCount");
	if (!initialized)
		return NOT_INITIALIZED;
	*n = ndev;
	return SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	ENTER("cuDeviceGet");
	if (!initialized)
		return NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= ndev)
		return INVALID_DEVICE;
	*d = 1000 + visible[ordinal]; // a handle, not the ordinal
	return SUCCESS;
}

static struct dev *devof(CUdevice d) {
	int i = d - 1000;
	if (i < 0 || i >= MAXDEV || devs[i].total == 0)
		return NULL;
	return &devs[i];
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	ENTER("cuDeviceGetName");
	struct dev *v = devof(d);
	if (!v)
		return INVALID_DEVICE;
	strncpy(name, v->name, len - 1);
	name[len - 1] = 0;
	return SUCCESS;
}

CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) {
	ENTER("cuDeviceGetUuid_v2");
	struct dev *v = devof(d);
	if (!v)
		return INVALID_DEVICE;
	memcpy(uuid, v->uuid, 16);
	return SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) { return cuDeviceGetUuid_v2(uuid, d); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
	ENTER("cuDeviceTotalMem_v2");
	struct dev *v = devof(d);
	if (!v)
		return INVALID_DEVICE;
	*bytes = v->total;
	return SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice d) {
	ENTER("cuDeviceGetAttribute");
	if (!devof(d))
		return INVALID_DEVICE;
	switch (attr) {
	case 75:
		*value = 8;
		return SUCCESS;
	case 76:
		*value = 0;
		return SUCCESS;
	}
	return INVALID_VALUE;
}

CUresult cuDevicePrimaryCtxRetain(struct ctx **pctx, CUdevice d) {
	ENTER("cuDevicePrimaryCtxRetain");
	if (!initialized)
		return NOT_INITIALIZED;
	struct dev *v = devof(d);
	if (!v)
		return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (v->retained == 0) {
		if (v->used + ctxbytes > v->total) {
			pthread_mutex_unlock(&mu);
			return OUT_OF_MEMORY;
		}
		v->used += ctxbytes;
	}
	v->retained++;
	pthread_mutex_unlock(&mu);
	*pctx = &v->ctx;
	return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	ENTER("cuDevicePrimaryCtxRelease_v2");
	struct dev *v = devof(d);
	if (!v || v->retained == 0)
		return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (--v->retained == 0)
		v->used -= ctxbytes;
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuCtxSetCurrent(struct ctx *c) {
	ENTER("cuCtxSetCurrent");
	if (c && c->magic != 0x5c7c)
		return INVALID_CONTEXT;
	cur = c;
	return SUCCESS;
}

CUresult cuCtxGetCurrent(struct ctx **c) {
	ENTER("cuCtxGetCurrent");
	*c = cur;
	return SUCCESS;
}

CUresult cuCtxSynchronize(void) {
	ENTER("cuCtxSynchronize");
	NEEDCTX();
	return SUCCESS;
}

#ifndef STUB_OMIT_cuMemAlloc_v2
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	ENTER("cuMemAlloc_v2");
	NEEDCTX();
	if (n == 0)
		return INVALID_VALUE;
	struct dev *v = &devs[cur->dev];
	pthread_mutex_lock(&mu);
	if (n > v->total - v->used) {
		pthread_mutex_unlock(&mu);
		return OUT_OF_MEMORY;
	}
	void *m = malloc(n);
	if (!m) {
		pthread_mutex_unlock(&mu);
		return OUT_OF_MEMORY;
	}
	if (poison)
		memset(m, 0xA5, n);
	struct alloc *a = malloc(sizeof *a);
	a->ptr = (uintptr_t)m;
	a->size = n;
	a->dev = cur->dev;
	a->next = allocs;
	allocs = a;
	nallocs++;
	v->used += n;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)m;
	return SUCCESS;
}
#endif

CUresult cuMemFree_v2(CUdeviceptr p) {
	ENTER("cuMemFree_v2");
	NEEDCTX();
	pthread_mutex_lock(&mu);
	for (struct alloc **pa = &allocs; *pa; pa = &(*pa)->next) {
		struct alloc *a = *pa;
		if (a->ptr == (uintptr_t)p) {
			if (a->dev != cur->dev) { // freed in another device's context
				pthread_mutex_unlock(&mu);
				return INVALID_CONTEXT;
			}
			*pa = a->next;
			devs[a->dev].used -= a->size;
			nallocs--;
			pthread_mutex_unlock(&mu);
			free((void *)a->ptr);
			free(a);
			return SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	ENTER("cuMemGetInfo_v2");
	NEEDCTX();
	pthread_mutex_lock(&mu);
	struct dev *v = &devs[cur->dev];
	*free = v->total - v->used;
	*total = v->total;
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

static CUresult memset_n(CUdeviceptr p, const void *val, int size, size_t n) {
	NEEDCTX();
	if (!stub_check_range((uintptr_t)p, n * size))
		return INVALID_VALUE;
	unsigned char *d = (unsigned char *)(uintptr_t)p;
	for (size_t i = 0; i < n; i++)
		memcpy(d + i * size, val, size);
	return SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
	ENTER("cuMemsetD8_v2");
	return memset_n(p, &v, 1, n);
}

CUresult cuMemsetD16_v2(CUdeviceptr p, unsigned short v, size_t n) {
	ENTER("cuMemsetD16_v2");
	return memset_n(p, &v, 2, n);
}

CUresult cuMemsetD32_v2(CUdeviceptr p, unsigned int v, size_t n) {
	ENTER("cuMemsetD32_v2");
	return memset_n(p, &v, 4, n);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	ENTER("cuMemcpyHtoD_v2");
	NEEDCTX();
	if (!stub_check_range((uintptr_t)dst, n))
		return INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, n);
	return SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpyDtoH_v2");
	NEEDCTX();
	if (!stub_check_range((uintptr_t)src, n))
		return INVALID_VALUE;
	memcpy(dst, (void *)(uintptr_t)src, n);
	return SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpyDtoD_v2");
	NEEDCTX();
	if (!stub_check_range((uintptr_t)dst, n) || !stub_check_range((uintptr_t)src, n))
		return INVALID_VALUE;
	memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
	return SUCCESS;
}

CUresult cuModuleLoadDataEx(struct module **mod, const void *image, unsigned nopts, int *opts, void **vals) {
	ENTER("cuModuleLoadDataEx");
	NEEDCTX();
	const char *img = (const char *)image;
	if (!strstr(img, ".version") || !strstr(img, ".entry")) {
		for (unsigned i = 0; i < nopts; i++)
			if (opts[i] == 5) { // CU_JIT_ERROR_LOG_BUFFER
				size_t size = 0;
				for (unsigned j = 0; j < nopts; j++)
					if (opts[j] == 6)
						size = (size_t)(uintptr_t)vals[j];
				if (size > 0)
					snprintf((char *)vals[i], size, "stub: the image is not PTX");
			}
		return INVALID_IMAGE;
	}
	struct module *m = malloc(sizeof *m);
	m->magic = 0x30d;
	m->image = strdup(img);
	*mod = m;
	return SUCCESS;
}

CUresult cuModuleGetFunction(struct function **f, struct module *m, const char *name) {
	ENTER("cuModuleGetFunction");
	NEEDCTX();
	if (!m || m->magic != 0x30d)
		return INVALID_HANDLE;
	char entry[96];
	snprintf(entry, sizeof entry, ".entry %s(", name);
	if (!strstr(m->image, entry))
		return NOT_FOUND;
	for (const struct host_kernel *k = host_kernels; k->name; k++)
		if (strcmp(k->name, name) == 0) {
			struct function *fn = malloc(sizeof *fn);
			fn->magic = 0xf00;
			fn->k = k;
			*f = fn;
			return SUCCESS;
		}
	return NOT_FOUND;
}

CUresult cuLaunchKernel(struct function *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *stream, void **kparams, void **extra) {
	ENTER("cuLaunchKernel");
	NEEDCTX();
	if (!f || f->magic != 0xf00)
		return INVALID_HANDLE;
	if (gy != 1 || gz != 1 || by != 1 || bz != 1 || gx == 0 || bx == 0 || bx > 1024 || shmem != 0 || stream != NULL)
		return INVALID_VALUE;
	u64 p[MAXPARAMS];
	int np = f->k->nparams;
	if (kparams) {
		for (int i = 0; i < np; i++)
			memcpy(&p[i], kparams[i], 8);
	} else if (extra) {
		void *buf = NULL;
		size_t size = 0;
		for (int i = 0; extra[i] != (void *)0; i += 2) {
			if (extra[i] == (void *)1)
				buf = extra[i + 1];
			else if (extra[i] == (void *)2)
				size = *(size_t *)extra[i + 1];
			else
				return INVALID_VALUE;
		}
		if (!buf || size != (size_t)np * 8)
			return INVALID_VALUE;
		memcpy(p, buf, size);
	} else
		return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct launch *l = &launches[nlaunch % MAXLAUNCH];
	strncpy(l->name, f->k->name, sizeof l->name - 1);
	l->grid = gx;
	l->block = bx;
	l->nparams = np;
	memcpy(l->params, p, sizeof(u64) * np);
	nlaunch++;
	pthread_mutex_unlock(&mu);
	kt_nblocks = gx;
	kt_ntid = bx;
	for (u64 b = 0; b < gx; b++)
		for (u64 t = 0; t < bx; t++) {
			kt_block = b;
			kt_tid = t;
			f->k->fn(p);
		}
	return SUCCESS;
}

static const struct {
	int code;
	const char *name, *msg;
} errs[] = {
	{0, "CUDA_SUCCESS", "no error"},
	{1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	{100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	{719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	{999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult cuGetErrorName(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		if (errs[i].code == r) {
			*s = errs[i].name;
			return SUCCESS;
		}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		if (errs[i].code == r) {
			*s = errs[i].msg;
			return SUCCESS;
		}
	*s = NULL;
	return INVALID_VALUE;
}
