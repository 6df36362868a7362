/*
 * Unit tests for workers/chain/chain.c: the op table, and the plan cache driven by
 * fake plan operations, for the paths the host backend never takes (CUDA
 * refusing to update a graph, a build failing) and the LRU order.
 */
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/chain/chain.h"

static char bufs[4][64] __attribute__((aligned(16)));

TEST(chain_op_table)
{
	CHECK_EQ(chain_op_find("sin", 3), KERNELS_CHAIN_SIN);
	CHECK_EQ(chain_op_find("fma", 3), KERNELS_CHAIN_FMA);
	CHECK_EQ(chain_op_find("log2x", 4), KERNELS_CHAIN_LOG2); /* only len bytes are read */
	CHECK(chain_op_find("log", 2) < 0);
	CHECK(chain_op_find("frob", 4) < 0);
	CHECK_EQ(chain_op_nargs(KERNELS_CHAIN_SQRT), 0);
	CHECK_EQ(chain_op_nargs(KERNELS_CHAIN_POW), 1);
	CHECK_EQ(chain_op_nargs(KERNELS_CHAIN_CLAMP), 2);
	CHECK_STR(chain_op_name(KERNELS_CHAIN_SIGMOID), "sigmoid");
	CHECK(strstr(chain_op_list(), "rsqrt abs neg relu"));
	CHECK_EQ(KERNELS_CHAIN_KINDS, 25);
	enum chain_mode m;
	CHECK(chain_mode_find("graph", &m) == 0 && m == CHAIN_GRAPH);
	CHECK(chain_mode_find("lazy", &m) < 0);
	CHECK(chain_dtype_supported(GPUQ_DTYPE_BF16) && !chain_dtype_supported(GPUQ_DTYPE_I64));
}

TEST(chain_kernels_and_bytes)
{
	static struct chain_spec s;
	struct kernels_chain_op ops[5] = { { KERNELS_CHAIN_SIN, 0, 0 } };
	for (int i = 1; i < 5; i++)
		ops[i] = ops[0];
	chain_spec_from_ops(&s, ops, 5, GPUQ_DTYPE_F16, bufs[0], bufs[0]);
	s.mode = CHAIN_GRAPH;
	s.repeat = 3;
	s.count = 100;
	CHECK(s.has_ops);
	CHECK_EQ(chain_kernels(&s), 15);
	CHECK_EQ(chain_bytes(&s), 15 * 2 * 100 * 2);
	s.mode = CHAIN_FUSED;
	CHECK_EQ(chain_kernels(&s), 1);
	CHECK_EQ(chain_bytes(&s), 2 * 100 * 2);
}

/* Fake plans: a counter per plan; retarget answers what the test says. */
static int fake_retarget_answer;
static bool fake_build_fails;
static int fake_live;

static int fake_build(struct device *dev, const struct chain_spec *spec, void **plan,
		      struct gpuq_error *err)
{
	(void)dev;
	(void)spec;
	if (fake_build_fails)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "build refused");
	*plan = malloc(1);
	fake_live++;
	return 0;
}

static int fake_retarget(struct device *dev, void *plan, const struct chain_spec *spec,
			 struct gpuq_error *err)
{
	(void)dev;
	(void)plan;
	(void)spec;
	if (fake_retarget_answer < 0)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "retarget failed");
	return fake_retarget_answer;
}

static void fake_destroy(struct device *dev, void *plan)
{
	(void)dev;
	free(plan);
	fake_live--;
}

static const struct chain_plan_ops fake_ops = {
	.build = fake_build, .retarget = fake_retarget, .destroy = fake_destroy,
};

static void spec_of(struct chain_spec *s, double c, int in, int out)
{
	struct kernels_chain_op op = { KERNELS_CHAIN_ADD, c, 0 };
	memset(s, 0, sizeof *s);
	chain_spec_from_ops(s, &op, 1, GPUQ_DTYPE_F32, bufs[in], bufs[out]);
	s->mode = CHAIN_GRAPH;
	s->repeat = 1;
	s->count = 16;
}

static enum chain_cache_outcome get(struct device *dev, struct chain_state *cs, double c, int in,
				    int out)
{
	struct chain_spec s;
	struct gpuq_error err;
	void *plan;
	spec_of(&s, c, in, out);
	CHECK(chain_cache_get(dev, cs, &s, &plan, &err) == 0 && plan);
	return s.result.cache;
}

#define COUNT(dev, name) chain_counter_get((dev), CHAIN_COUNTER_##name)

TEST(chain_cache_lru_update_and_rebuild)
{
	struct device dev;
	struct gpuq_error err;
	memset(&dev, 0, sizeof dev);
	dev.config.chain_graph_cache = 3;
	struct chain_state *cs = chain_state_get(&dev, &fake_ops, &err);
	CHECK(cs && dev.chain == cs);
	CHECK_EQ(get(&dev, cs, 1, 0, 0), CHAIN_CACHE_MISS);
	CHECK_EQ(get(&dev, cs, 2, 0, 0), CHAIN_CACHE_MISS);
	CHECK_EQ(get(&dev, cs, 3, 0, 0), CHAIN_CACHE_MISS);
	CHECK_EQ(get(&dev, cs, 1, 0, 0), CHAIN_CACHE_HIT); /* 2 is now the least recently used */
	CHECK_EQ(get(&dev, cs, 4, 0, 0), CHAIN_CACHE_MISS);
	CHECK_EQ(COUNT(&dev, graph_evictions), 1);
	CHECK_EQ(get(&dev, cs, 1, 0, 0), CHAIN_CACHE_HIT);
	CHECK_EQ(get(&dev, cs, 3, 0, 0), CHAIN_CACHE_HIT);
	CHECK_EQ(get(&dev, cs, 2, 0, 0), CHAIN_CACHE_MISS); /* it was the one evicted */
	CHECK_EQ(fake_live, 3);
	CHECK_EQ(COUNT(&dev, graph_entries), 3);
	/* Other buffers: an update, and no new plan. */
	CHECK_EQ(get(&dev, cs, 2, 1, 2), CHAIN_CACHE_UPDATE);
	CHECK_EQ(COUNT(&dev, graph_updates), 1);
	CHECK_EQ(get(&dev, cs, 2, 1, 2), CHAIN_CACHE_HIT);
	/* CUDA refusing an update: the plan is rebuilt, counted as an instantiation. */
	uint64_t inst = COUNT(&dev, graph_instantiations);
	fake_retarget_answer = 1;
	CHECK_EQ(get(&dev, cs, 2, 3, 3), CHAIN_CACHE_UPDATE);
	CHECK_EQ(COUNT(&dev, graph_instantiations), inst + 1);
	CHECK_EQ(COUNT(&dev, graph_updates), 1);
	CHECK_EQ(fake_live, 3);
	CHECK_EQ(get(&dev, cs, 2, 3, 3), CHAIN_CACHE_HIT);
	fake_retarget_answer = 0;
	chain_state_close(&dev);
	CHECK(dev.chain == NULL);
	CHECK_EQ(fake_live, 0);
	CHECK_EQ(COUNT(&dev, graph_entries), 0);
}

TEST(chain_cache_failures_leave_it_consistent)
{
	struct device dev;
	struct gpuq_error err;
	struct chain_spec s;
	void *plan;
	memset(&dev, 0, sizeof dev);
	dev.config.chain_graph_cache = 2;
	struct chain_state *cs = chain_state_get(&dev, &fake_ops, &err);
	CHECK(cs);
	fake_build_fails = true;
	spec_of(&s, 1, 0, 0);
	CHECK(chain_cache_get(&dev, cs, &s, &plan, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_DEVICE_ERROR);
	CHECK_EQ(COUNT(&dev, graph_entries), 0);
	fake_build_fails = false;
	CHECK_EQ(get(&dev, cs, 1, 0, 0), CHAIN_CACHE_MISS);
	fake_retarget_answer = -1;
	spec_of(&s, 1, 1, 1);
	CHECK(chain_cache_get(&dev, cs, &s, &plan, &err) < 0);
	fake_retarget_answer = 0;
	/* A failed retarget drops the plan: it may be half updated. */
	CHECK_EQ(COUNT(&dev, graph_entries), 0);
	CHECK_EQ(fake_live, 0);
	CHECK_EQ(get(&dev, cs, 1, 0, 0), CHAIN_CACHE_MISS);
	/* Constants compare as bits: mul 0 and mul -0 differ (x * -0 is -0 for x > 0). */
	CHECK_EQ(get(&dev, cs, 0.0, 2, 2), CHAIN_CACHE_MISS);
	CHECK_EQ(get(&dev, cs, -0.0, 2, 2), CHAIN_CACHE_MISS);
	CHECK_EQ(get(&dev, cs, 0.0, 2, 2), CHAIN_CACHE_HIT);
	chain_state_close(&dev);
	CHECK_EQ(fake_live, 0);
}
