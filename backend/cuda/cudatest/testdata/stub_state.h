// The stub libcuda.so.1's state (included by stub_cuda.c): devices,
// contexts, allocations, call counters with error injection, and the log of
// kernel launches, with the stub_* functions tests use to read and drive
// them.

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
	SUCCESS = 0,
	INVALID_VALUE = 1,
	OUT_OF_MEMORY = 2,
	NOT_INITIALIZED = 3,
	NO_DEVICE = 100,
	INVALID_DEVICE = 101,
	INVALID_IMAGE = 200,
	INVALID_CONTEXT = 201,
	INVALID_HANDLE = 400,
	NOT_FOUND = 500,
};

#define MAXDEV 8

struct ctx {
	int magic;
	int dev;
};

struct dev {
	char name[64];
	unsigned char uuid[16];
	size_t total, used;
	int retained;
	struct ctx ctx;
};

struct alloc {
	uintptr_t ptr;
	size_t size;
	int dev;
	struct alloc *next;
};

struct module {
	int magic;
	char *image;
};

struct function {
	int magic;
	const struct host_kernel *k;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized, ndev, poison = 1;
static size_t ctxbytes = 64 << 20;
static int visible[MAXDEV]; // stub device index of each CUDA ordinal
static struct dev devs[MAXDEV];
static struct alloc *allocs;
static int nallocs;
static __thread struct ctx *cur;

// ---- call counting and error injection

#define MAXNAMES 64
static struct {
	char name[48];
	int calls;
	int fail_code, fail_after, fail_times;
} counters[MAXNAMES];

static int counter(const char *name) {
	for (int i = 0; i < MAXNAMES; i++) {
		if (counters[i].name[0] == 0) {
			strncpy(counters[i].name, name, sizeof counters[i].name - 1);
			return i;
		}
		if (strcmp(counters[i].name, name) == 0)
			return i;
	}
	return MAXNAMES - 1;
}

// enter counts a call and returns an injected error code, or 0.
static int enter(const char *name) {
	pthread_mutex_lock(&mu);
	int i = counter(name);
	counters[i].calls++;
	int code = 0;
	if (counters[i].fail_times > 0) {
		if (counters[i].fail_after > 0)
			counters[i].fail_after--;
		else {
			counters[i].fail_times--;
			code = counters[i].fail_code;
		}
	}
	pthread_mutex_unlock(&mu);
	return code;
}

#define ENTER(name)                       \
	do {                                  \
		int inj_ = enter(name);           \
		if (inj_)                         \
			return inj_;                  \
	} while (0)

#define NEEDCTX()                         \
	do {                                  \
		if (!initialized)                 \
			return NOT_INITIALIZED;       \
		if (!cur)                         \
			return INVALID_CONTEXT;       \
	} while (0)

// stub_fail makes the next `times` calls of `name` after `after` more
// successful ones return code.
void stub_fail(const char *name, int code, int after, int times) {
	pthread_mutex_lock(&mu);
	int i = counter(name);
	counters[i].fail_code = code;
	counters[i].fail_after = after;
	counters[i].fail_times = times;
	pthread_mutex_unlock(&mu);
}

int stub_calls(const char *name) {
	pthread_mutex_lock(&mu);
	int n = counters[counter(name)].calls;
	pthread_mutex_unlock(&mu);
	return n;
}

// ---- ranges

// find returns the allocation holding [p, p+n), or NULL.
static struct alloc *find(uintptr_t p, size_t n) {
	for (struct alloc *a = allocs; a; a = a->next)
		if (p >= a->ptr && p < a->ptr + a->size && n <= a->size - (p - a->ptr))
			return a;
	return NULL;
}

int stub_check_range(uintptr_t p, size_t n) {
	pthread_mutex_lock(&mu);
	int ok = find(p, n) != NULL;
	pthread_mutex_unlock(&mu);
	return ok;
}

size_t stub_used(int ordinal) {
	pthread_mutex_lock(&mu);
	size_t u = ordinal >= 0 && ordinal < ndev ? devs[visible[ordinal]].used : 0;
	pthread_mutex_unlock(&mu);
	return u;
}

int stub_live_allocs(void) {
	pthread_mutex_lock(&mu);
	int n = nallocs;
	pthread_mutex_unlock(&mu);
	return n;
}

// stub_current returns the CUDA ordinal of the calling thread's current
// context, or -1.
int stub_current(void) {
	if (!cur)
		return -1;
	for (int i = 0; i < ndev; i++)
		if (visible[i] == cur->dev)
			return i;
	return -1;
}

// ---- launches

#define MAXLAUNCH 64
#define MAXPARAMS 16
static struct launch {
	char name[48];
	unsigned grid, block;
	int nparams;
	u64 params[MAXPARAMS];
} launches[MAXLAUNCH];
static int nlaunch;

int stub_launch_count(void) { return nlaunch; }

// stub_launch_get copies launch i (0 the oldest kept; the last MAXLAUNCH
// are kept) and returns its number of parameters, or -1.
int stub_launch_get(int i, char *name, int namelen, u64 *params, unsigned *grid, unsigned *block) {
	int first = nlaunch > MAXLAUNCH ? nlaunch - MAXLAUNCH : 0;
	if (i < first || i >= nlaunch)
		return -1;
	struct launch *l = &launches[i % MAXLAUNCH];
	strncpy(name, l->name, namelen - 1);
	name[namelen - 1] = 0;
	memcpy(params, l->params, sizeof(u64) * l->nparams);
	*grid = l->grid;
	*block = l->block;
	return l->nparams;
}
