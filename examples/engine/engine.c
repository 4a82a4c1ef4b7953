// SPDX-License-Identifier: MIT
/*
 * engine - a small inference-engine stand-in that uses libsnapkv the way a
 * serving engine would: it writes a prompt's post-RoPE K/V (and the window's
 * queries) into a registered buffer, asks snapkvd for a compaction, then
 * decodes N steps, attending over the compact cache, writing each new K/V
 * row in place at slot kept + g with logical position L + g, reporting
 * APPEND and GROWing when the headroom runs out. Prints its ledger line.
 *
 *   engine [--socket PATH] [--name NAME] [--layers N] [--h-q N] [--h-kv N]
 *          [--head-dim D] [--prompt L] [--window W] [--capacity C]
 *          [--decode N] [--reserve R] [--gqa expand|group] [--seed S]
 *          [--hold-until FILE]   (keep the cache until FILE exists, at most 30 s)
 *          [--linger]            (release the cache with linger once decoded: the
 *                                 daemon keeps it, counted, while the session lives)
 *          [--in FILE.safetensors] (prefill K/V from a dump: layers.N.q [H_q, rows, D],
 *                                   layers.N.k/.v [H_kv, L, D], as snapkvctl reads;
 *                                   converted to f32, shapes taken from the file)
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "skv-safetensors.h"
#include "snapkv.h"

static float frand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

struct cfg {
	const char *socket, *name, *hold, *in;
	uint32_t layers, h_q, h_kv, d, L, w, C, decode, reserve;
	enum skv_gqa gqa;
	uint64_t seed;
	int linger;
};

static int parse(int argc, char **argv, struct cfg *c)
{
	static const struct option o[] = {
	    {"socket", 1, 0, 's'}, {"name", 1, 0, 'n'},	      {"layers", 1, 0, 'l'},
	    {"h-q", 1, 0, 'q'},	   {"h-kv", 1, 0, 'k'},	      {"head-dim", 1, 0, 'd'},
	    {"prompt", 1, 0, 'L'}, {"window", 1, 0, 'w'},     {"capacity", 1, 0, 'C'},
	    {"decode", 1, 0, 'g'}, {"reserve", 1, 0, 'r'},    {"gqa", 1, 0, 'G'},
	    {"seed", 1, 0, 'S'},   {"hold-until", 1, 0, 'H'}, {"in", 1, 0, 'i'},
	    {"linger", 0, 0, 'Y'}, {"help", 0, 0, 'h'},	      {0},
	};
	int ch;

	*c = (struct cfg){.name = "engine",
			  .layers = 4,
			  .h_q = 8,
			  .h_kv = 2,
			  .d = 64,
			  .L = 1024,
			  .w = 32,
			  .C = 256,
			  .decode = 64,
			  .reserve = 16,
			  .gqa = SKV_GQA_GROUP,
			  .seed = 1};
	while ((ch = getopt_long(argc, argv, "", o, NULL)) != -1) {
		unsigned long v = optarg ? strtoul(optarg, NULL, 10) : 0;

		switch (ch) {
		case 's':
			c->socket = optarg;
			break;
		case 'n':
			c->name = optarg;
			break;
		case 'l':
			c->layers = v;
			break;
		case 'q':
			c->h_q = v;
			break;
		case 'k':
			c->h_kv = v;
			break;
		case 'd':
			c->d = v;
			break;
		case 'L':
			c->L = v;
			break;
		case 'w':
			c->w = v;
			break;
		case 'C':
			c->C = v;
			break;
		case 'g':
			c->decode = v;
			break;
		case 'r':
			c->reserve = v;
			break;
		case 'G':
			c->gqa = !strcmp(optarg, "group") ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
			break;
		case 'S':
			c->seed = v;
			break;
		case 'H':
			c->hold = optarg;
			break;
		case 'i':
			c->in = optarg;
			break;
		case 'Y':
			c->linger = 1;
			break;
		default:
			fprintf(stderr,
				"usage: engine [--socket PATH] [--name NAME] [--layers N] "
				"[--h-q N] [--h-kv N] [--head-dim D] [--prompt L] [--window W] "
				"[--capacity C] [--decode N] [--reserve R] [--gqa expand|group] "
				"[--seed S] [--hold-until FILE] [--in FILE.safetensors] "
				"[--linger]\n");
			return -EINVAL;
		}
	}
	if (!c->layers || !c->h_q || !c->h_kv || c->h_q % c->h_kv || !c->d || c->layers > 64 ||
	    c->w > c->L || c->d > 512) {
		fprintf(stderr, "engine: invalid shape\n");
		return -EINVAL;
	}
	return 0;
}

static float to_f32(const struct skv_st_tensor *t, size_t i)
{
	const uint16_t *h = t->data;

	switch (t->dtype) {
	case SKV_ST_F32: {
		float f;
		memcpy(&f, (const char *)t->data + 4 * i, 4);
		return f;
	}
	case SKV_ST_F16:
		return skv_f16_to_f32(h[i]);
	case SKV_ST_BF16:
		return skv_bf16_to_f32(h[i]);
	default:
		return 0;
	}
}

/* Shapes of a safetensors prefill dump; 0 or -EINVAL with a message. */
static int file_shape(struct skv_st_file *f, struct cfg *c)
{
	char name[64];
	const struct skv_st_tensor *q, *k;

	c->layers = 0;
	for (;;) {
		snprintf(name, sizeof(name), "layers.%u.k", c->layers);
		if (!skv_st_find(f, name))
			break;
		c->layers++;
	}
	q = skv_st_find(f, "layers.0.q");
	k = skv_st_find(f, "layers.0.k");
	if (!c->layers || c->layers > 64 || !q || !k || q->rank != 3 || k->rank != 3 ||
	    q->shape[2] != k->shape[2] || k->shape[1] > (1u << 20) || k->shape[2] > 512) {
		fprintf(stderr,
			"engine: %s: expected layers.N.q [H_q, rows, D] and "
			"layers.N.k/.v [H_kv, L, D]\n",
			c->in);
		return -EINVAL;
	}
	c->h_q = q->shape[0];
	c->h_kv = k->shape[0];
	c->L = k->shape[1];
	c->d = k->shape[2];
	if (c->w > q->shape[1])
		c->w = q->shape[1];
	for (uint32_t l = 0; l < c->layers; l++) {
		const char *kinds = "qkv";
		for (int j = 0; j < 3; j++) {
			const struct skv_st_tensor *t;
			snprintf(name, sizeof(name), "layers.%u.%c", l, kinds[j]);
			t = skv_st_find(f, name);
			if (!t || t->rank != 3 || t->dtype == SKV_ST_I32 ||
			    t->shape[0] != (j ? c->h_kv : c->h_q) || t->shape[2] != c->d ||
			    (j && t->shape[1] != c->L) || (!j && t->shape[1] != q->shape[1])) {
				fprintf(stderr, "engine: %s: %s missing or misshapen\n", c->in,
					name);
				return -EINVAL;
			}
		}
	}
	return 0;
}

/* Attention of one query over the compact cache of one stored head. */
static float attend(const struct skv_cache *k, uint32_t l, uint32_t h, const float *q, uint32_t n)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	const float *K = skv_cache_k(k, l, h), *V = skv_cache_v(k, l, h);
	float mx = -INFINITY, sum = 0, out = 0;
	float *z = malloc(n * sizeof(float));

	for (uint32_t i = 0; i < n; i++) {
		float dot = 0;
		for (uint32_t x = 0; x < ci->head_dim; x++)
			dot += q[x] * K[(size_t)i * ci->token_stride + x];
		z[i] = dot / sqrtf((float)ci->head_dim);
		if (z[i] > mx)
			mx = z[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		float e = expf(z[i] - mx);
		sum += e;
		out += e * V[(size_t)i * ci->token_stride];
	}
	free(z);
	return out / sum;
}

int main(int argc, char **argv)
{
	struct cfg c;
	struct skv_client_opts opts = {.opts_size = sizeof(opts)};
	struct skv_client *cl = NULL;
	struct skv_buffer *buf = NULL;
	struct skv_cache *cache = NULL;
	struct skv_compact_desc desc;
	struct skv_layer_ref *lr;
	size_t qb, kvb, total;
	float *data, checksum = 0;
	uint32_t grows = 0;
	int r;

	struct skv_st_file *in = NULL;
	struct skv_st_error sterr;

	if (parse(argc, argv, &c) < 0)
		return 2;
	if (c.in) {
		if (skv_st_open(c.in, &in, &sterr) < 0) {
			fprintf(stderr, "engine: %s: %s\n", c.in, sterr.msg);
			return 2;
		}
		if (file_shape(in, &c) < 0) {
			skv_st_close(in);
			return 2;
		}
	}
	opts.name = c.name;
	r = skv_client_connect(c.socket, &opts, &cl);
	if (r < 0) {
		fprintf(stderr, "engine %s: connect: %s\n", c.name, strerror(-r));
		return 1;
	}
	/* prefill output: per layer Q-window [h_q][W][D], K and V [h_kv][L][D], HND */
	qb = (size_t)c.h_q * c.w * c.d * 4;
	kvb = (size_t)c.h_kv * c.L * c.d * 4;
	total = (qb + 2 * kvb) * c.layers;
	r = skv_buffer_alloc(cl, total, &buf);
	if (r < 0)
		goto fail;
	data = skv_buffer_data(buf);
	lr = calloc(c.layers, sizeof(*lr));
	for (uint32_t l = 0; l < c.layers; l++) {
		size_t base = l * (qb + 2 * kvb);
		float *q = (float *)((char *)data + base), *k = q + qb / 4, *v = k + kvb / 4;

		if (in) {
			char nm[64];
			const struct skv_st_tensor *tq, *tk, *tv;

			snprintf(nm, sizeof(nm), "layers.%u.q", l);
			tq = skv_st_find(in, nm);
			snprintf(nm, sizeof(nm), "layers.%u.k", l);
			tk = skv_st_find(in, nm);
			snprintf(nm, sizeof(nm), "layers.%u.v", l);
			tv = skv_st_find(in, nm);
			/* the window: the last W of the file's query rows */
			for (uint32_t h = 0; h < c.h_q; h++)
				for (uint32_t t = 0; t < c.w; t++)
					for (uint32_t x = 0; x < c.d; x++)
						q[((size_t)h * c.w + t) * c.d + x] =
						    to_f32(tq, ((size_t)h * tq->shape[1] +
								tq->shape[1] - c.w + t) *
								       c.d +
								   x);
			for (size_t i = 0; i < kvb / 4; i++) {
				k[i] = to_f32(tk, i);
				v[i] = to_f32(tv, i);
			}
		} else {
			/* a few positions per head carry keys aligned with the window's
			 * queries: the heavy hitters compaction should keep */
			for (size_t i = 0; i < qb / 4; i++)
				q[i] = frand(&c.seed);
			for (uint32_t h = 0; h < c.h_kv; h++)
				for (uint32_t t = 0; t < c.L; t++) {
					int heavy = (t * 2654435761u + h * 40503u + l) % 37 == 0;
					for (uint32_t x = 0; x < c.d; x++) {
						float qx =
						    q[((size_t)(h * (c.h_q / c.h_kv)) * c.w) * c.d +
						      x];
						k[((size_t)h * c.L + t) * c.d + x] =
						    heavy ? 3.0f * qx : 0.5f * frand(&c.seed);
						v[((size_t)h * c.L + t) * c.d + x] = frand(&c.seed);
					}
				}
		}
		lr[l].q = (struct skv_tensor_ref){buf, base, SKV_DTYPE_F32, (int64_t)c.w * c.d, c.d,
						  0,   0};
		lr[l].k = (struct skv_tensor_ref){
		    buf, base + qb, SKV_DTYPE_F32, (int64_t)c.L * c.d, c.d, 0, 0};
		lr[l].v = (struct skv_tensor_ref){
		    buf, base + qb + kvb, SKV_DTYPE_F32, (int64_t)c.L * c.d, c.d, 0, 0};
	}
	memset(&desc, 0, sizeof(desc));
	desc.desc_size = sizeof(desc);
	desc.shape = (struct skv_shape){
	    .prompt_len = c.L, .head_dim = c.d, .h_q = c.h_q, .h_kv = c.h_kv, .n_q = c.w};
	desc.layers = c.layers;
	skv_client_params_init(&desc.params);
	desc.params.window = c.w;
	desc.params.capacity = c.C;
	desc.params.gqa = c.gqa;
	desc.layer = lr;
	desc.out_layout = SKV_LAYOUT_HND;
	desc.decode_reserve = c.reserve;
	r = skv_client_compact(cl, &desc, &cache);
	free(lr);
	skv_st_close(in);
	in = NULL;
	if (r < 0)
		goto fail;
	/* the prompt's buffer is not needed any more: the compact cache is ours */
	skv_buffer_free(buf);
	buf = NULL;

	const struct skv_cache_info *ci = skv_cache_info(cache);
	float mmin = 1, msum = 0;
	for (uint32_t l = 0; l < ci->layers; l++)
		for (uint32_t h = 0; h < ci->h_store; h++) {
			float m = skv_cache_retained_mass(cache, l, h);
			mmin = m < mmin ? m : mmin;
			msum += m;
		}
	float *q = malloc(c.d * sizeof(float));
	for (uint32_t g = 0; g < c.decode; g++) {
		if (skv_cache_next_slot(cache) == skv_cache_info(cache)->capacity) {
			r = skv_cache_grow(cache, c.reserve ? c.reserve : 16);
			if (r < 0)
				goto fail;
			grows++;
		}
		ci = skv_cache_info(cache);
		uint32_t slot = skv_cache_next_slot(cache);
		for (uint32_t l = 0; l < ci->layers; l++)
			for (uint32_t h = 0; h < ci->h_store; h++) {
				for (uint32_t x = 0; x < c.d; x++)
					q[x] = frand(&c.seed);
				/* the new token's K (rotated at position L + g) and V */
				float *kr = (float *)skv_cache_k(cache, l, h) +
					    (size_t)slot * ci->token_stride;
				float *vr = (float *)skv_cache_v(cache, l, h) +
					    (size_t)slot * ci->token_stride;
				for (uint32_t x = 0; x < c.d; x++) {
					kr[x] = 0.5f * frand(&c.seed);
					vr[x] = frand(&c.seed);
				}
				checksum += attend(cache, l, h, q, slot + 1);
			}
		r = skv_cache_append(cache, 1);
		if (r < 0)
			goto fail;
	}
	free(q);
	ci = skv_cache_info(cache);
	/* SPEC.md ledger for this cache (B = 1, s = 4 bytes) */
	uint64_t s = 4, g = ci->appended, hs = ci->h_store;
	uint64_t native = 2ull * c.layers * c.h_kv * (c.L + g) * c.d * s;
	uint64_t compact = 2ull * c.layers * hs * (ci->kept + g) * c.d * s;
	printf("engine %s: cache %llu L=%u kept=%u g=%u next_pos=%u slots=%u grows=%u "
	       "mass_min=%.3f mass_mean=%.3f native_full=%llu compact=%llu ratio=%.3f "
	       "checksum=%.4f\n",
	       c.name, (unsigned long long)ci->id, ci->prompt_len, ci->kept, ci->appended,
	       skv_cache_next_position(cache), ci->capacity, grows, mmin,
	       msum / (ci->layers * ci->h_store), (unsigned long long)native,
	       (unsigned long long)compact, (double)compact / (double)native, checksum);
	if (c.linger) {
		/* the handle goes; the daemon keeps the cache until the session ends */
		r = skv_cache_release_linger(cache);
		cache = NULL;
		if (r < 0)
			goto fail;
	}
	fflush(stdout);
	/* the demo reads the ledger while we still hold the cache */
	for (int i = 0; c.hold && i < 3000 && access(c.hold, F_OK) != 0; i++)
		usleep(10000);
	r = skv_cache_release(cache);
	skv_client_close(cl);
	return r < 0 ? 1 : 0;
fail:
	fprintf(stderr, "engine %s: %s (%s)\n", c.name, skv_client_error(cl), strerror(-r));
	skv_cache_release(cache);
	skv_buffer_free(buf);
	skv_client_close(cl);
	return 1;
}
