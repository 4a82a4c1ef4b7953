// SPDX-License-Identifier: MIT
/*
 * tiny-llama: generate text with a small GGUF Llama, from its full KV cache
 * or from a cache compacted by SnapKV (or another policy of SPEC.md), either
 * through snapkvd (libsnapkv) as a serving engine would, or in process with
 * libskv (--local).
 *
 * The serving flow: the prompt is prefilled with full attention straight
 * into a memfd registered with the daemon (post-RoPE K and V, and the
 * queries the policy needs); COMPACT returns a compact cache in the
 * session's arena; the first new token comes from the full prefill logits;
 * every further token is decoded from the compact cache in the arena, its
 * K/V written in place at slot kept + g, rotated at position L + g, and
 * reported with APPEND; GROW when the headroom runs out; RELEASE at the end.
 * --compare decodes the full cache (in the same buffer) in lockstep and
 * reports how many tokens agree and whether the logits are bit-identical.
 */
#include <errno.h>
#include <stdbool.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <snapkv.h>

#include "tl-compact.h"
#include "tl-model.h"

enum backend { BK_FULL, BK_LOCAL, BK_DAEMON };

struct opts {
	const char *model;
	const char *prompt;
	const char *socket;
	const char *name;
	uint32_t steps;
	float temp;
	uint64_t seed;
	struct skv_params params;
	enum backend backend;
	enum skv_layout layout;
	uint32_t reserve;
	uint32_t grow;
	uint32_t pause_ms;
	int compare;
	int print_positions;
	int quiet;
	const char *budget;	    /* --budget as given, NULL: uniform C */
	char *prompt_buf;	    /* --prompt-file's contents */
	const char *question;	    /* --question: the end of the user message */
	int chat;		    /* --chat: the model's chat template around the prompt */
	int window_question;	    /* -W question */
	int print_tokens;	    /* --print-tokens: the prompt's ids, then exit */
	uint32_t keep_pct;	    /* -C N%: C = N % of the prompt (at least W + 1) */
	const char *tokenize_lines; /* --tokenize-lines FILE: each line's ids, then exit */
	const char *dump_logits;    /* --dump-logits FILE: the prefill's last logits, f32 */
	const char *also;	    /* --also-window LIST: more compactions, one prefill */
	uint32_t qwin;		    /* the question's W (--chat) */
};

/*
 * SmolLM2's chat template (tokenizer.chat_template) for one user message,
 * with its default system message: the head up to the user's text, and
 * the tail after it that asks the assistant to answer.
 */
#define CHAT_HEAD                                                                                  \
	"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "     \
	"Face<|im_end|>\n<|im_start|>user\n"
#define CHAT_TAIL "<|im_end|>\n<|im_start|>assistant\n"
/* -W question: W = the question's tokens and the template's after it, clamped */
#define QWIN_MIN 8u
#define QWIN_MAX 64u

/* A budget mode beyond uniform C, or a fallback: tl_compact_budget(). */
static bool budgeted(const struct skv_params *p)
{
	return p->budget_mode != SKV_BUDGET_UNIFORM || p->fallback_below > 0.0f;
}

static void usage(FILE *f)
{
	fprintf(
	    f, "usage: tiny-llama [-m model.gguf] [-p prompt] [-n steps] [-t temp] [-s seed]\n"
	       "         [--policy none|snapkv|h2o|streamingllm|window] [-C capacity] [-W window]\n"
	       "         [-k kernel] [--pool avg|max] [--gqa expand|group] [--sinks S]\n"
	       "         [--socket PATH | --local] [--layout hnd|nhd] [--reserve R] [--grow N]\n"
	       "         [--protect B:E ...] [--compare] [--name NAME]\n"
	       "         [--pause-before-release MS] [--print-positions] [-q]\n"
	       "         [--budget B] [--fallback-below F]\n"
	       "         [-f prompt-file] [--chat] [--question Q] [-W question] [--print-tokens]\n"
	       "-C N%% keeps N %% of the prompt per stored head (at least W + 1).\n"
	       "--tokenize-lines FILE prints each line's token ids (no BOS) and exits;\n"
	       "--dump-logits FILE writes the prefill's last logits (f32, vocab entries).\n"
	       "--span S keeps S neighbours on either side of each position picked by\n"
	       "score, until the budget is used (kernels/skv.h; 0 = top-k).\n"
	       "--also-window W[/N%%][/kK][/sS],.. (snapkv, daemon): after the first, one\n"
	       "more compaction of the same prefill per window (a number or question; /N%%:\n"
	       "C = N %% of the prompt; /kK, /sS, /group: its kernel, span, gqa), each decoded "
	       "greedily from "
	       "its compact cache and\n"
	       "printed as '--- window W (C c, ...): text'.\n"
	       "Without --policy (or with none) the full cache is used. With a policy the\n"
	       "cache is compacted by snapkvd at --socket (default: libsnapkv's search:\n"
	       "$SNAPKV_SOCKET, $XDG_RUNTIME_DIR/snapkvd.sock), or in process with --local.\n"
	       "--budget takes snapkvctl's budget modes (layers:C0,C1,.., pyramid:R, heads[:A],\n"
	       "mass:TAU[:CMIN:CMAX:STEP], mass-heads:TAU[:CMIN:CMAX]); --fallback-below F\n"
	       "keeps the full prompt when a head's retained mass would be below F.\n"
	       "--chat wraps the prompt in the model's chat template (one user message) and\n"
	       "prints only the answer; --question Q (implies --chat) ends the user message\n"
	       "with Q after a blank line; -W question sets W to the tokens of Q (or of the\n"
	       "whole user message) and the template's tokens after it, clamped to [8, 64].\n"
	       "The model defaults to $SNAPKV_MODEL, else ../shared/models/stories260K.gguf.\n");
}

static int parse_u32(const char *s, uint32_t *ret)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

/* "B:E" -> a protected range [B, E) of prompt positions. */
static int parse_range(const char *s, struct skv_params *p)
{
	char b[32];
	const char *colon = strchr(s, ':');
	uint32_t lo, hi;
	if (!colon || (size_t)(colon - s) >= sizeof(b) || p->n_protected >= SKV_MAX_PROTECTED)
		return -EINVAL;
	memcpy(b, s, colon - s);
	b[colon - s] = 0;
	if (parse_u32(b, &lo) < 0 || parse_u32(colon + 1, &hi) < 0 || lo >= hi)
		return -EINVAL;
	p->protected_ranges[p->n_protected++] = (struct skv_range){lo, hi};
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {{"model", required_argument, NULL, 'm'},
					   {"prompt", required_argument, NULL, 'p'},
					   {"steps", required_argument, NULL, 'n'},
					   {"temp", required_argument, NULL, 't'},
					   {"seed", required_argument, NULL, 's'},
					   {"policy", required_argument, NULL, 1},
					   {"capacity", required_argument, NULL, 'C'},
					   {"window", required_argument, NULL, 'W'},
					   {"kernel", required_argument, NULL, 'k'},
					   {"pool", required_argument, NULL, 2},
					   {"gqa", required_argument, NULL, 3},
					   {"sinks", required_argument, NULL, 4},
					   {"reserve", required_argument, NULL, 5},
					   {"compare", no_argument, NULL, 6},
					   {"socket", required_argument, NULL, 7},
					   {"local", no_argument, NULL, 8},
					   {"layout", required_argument, NULL, 9},
					   {"grow", required_argument, NULL, 10},
					   {"name", required_argument, NULL, 11},
					   {"pause-before-release", required_argument, NULL, 12},
					   {"protect", required_argument, NULL, 13},
					   {"print-positions", no_argument, NULL, 14},
					   {"budget", required_argument, NULL, 15},
					   {"fallback-below", required_argument, NULL, 16},
					   {"quiet", no_argument, NULL, 'q'},
					   {"prompt-file", required_argument, NULL, 'f'},
					   {"chat", no_argument, NULL, 17},
					   {"question", required_argument, NULL, 18},
					   {"print-tokens", no_argument, NULL, 19},
					   {"tokenize-lines", required_argument, NULL, 20},
					   {"dump-logits", required_argument, NULL, 21},
					   {"also-window", required_argument, NULL, 22},
					   {"span", required_argument, NULL, 23},
					   {"help", no_argument, NULL, 'h'},
					   {0, 0, 0, 0}};
	int c, bad = 0, policy = 0, local = 0;

	o->model =
	    getenv("SNAPKV_MODEL") ? getenv("SNAPKV_MODEL") : "../shared/models/stories260K.gguf";
	o->prompt = "";
	o->name = "tiny-llama";
	o->steps = 64;
	o->seed = 42;
	skv_params_init(&o->params);
	o->params.window = 8;
	o->params.capacity = 16;
	o->reserve = 16;
	o->grow = 16;
	o->layout = SKV_LAYOUT_HND;
	while ((c = getopt_long(argc, argv, "m:p:n:t:s:C:W:k:f:qh", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			o->model = optarg;
			break;
		case 'p':
			o->prompt = optarg;
			break;
		case 'n':
			bad |= parse_u32(optarg, &o->steps) < 0;
			break;
		case 't':
			o->temp = strtof(optarg, NULL);
			break;
		case 's':
			o->seed = strtoull(optarg, NULL, 10);
			break;
		case 'C': {
			size_t n = strlen(optarg);
			char num[16];

			if (n > 1 && n < sizeof(num) && optarg[n - 1] == '%') {
				memcpy(num, optarg, n - 1);
				num[n - 1] = 0;
				bad |= parse_u32(num, &o->keep_pct) < 0 || !o->keep_pct ||
				       o->keep_pct > 100;
			} else {
				bad |= parse_u32(optarg, &o->params.capacity) < 0;
			}
			break;
		}
		case 'W':
			if (!strcmp(optarg, "question"))
				o->window_question = 1;
			else
				bad |= parse_u32(optarg, &o->params.window) < 0;
			break;
		case 'f': {
			FILE *f = fopen(optarg, "r");
			size_t cap = 1 << 16, n = 0, got;

			free(o->prompt_buf);
			o->prompt_buf = malloc(cap);
			while (f && o->prompt_buf &&
			       (got = fread(o->prompt_buf + n, 1, cap - n - 1, f)) > 0) {
				n += got;
				if (n + 1 == cap) {
					char *nb = realloc(o->prompt_buf, cap *= 2);
					if (!nb)
						break;
					o->prompt_buf = nb;
				}
			}
			if (!f || !o->prompt_buf || ferror(f)) {
				fprintf(stderr, "tiny-llama: cannot read %s\n", optarg);
				bad = 1;
			} else {
				o->prompt_buf[n] = 0;
				o->prompt = o->prompt_buf;
			}
			if (f)
				fclose(f);
			break;
		}
		case 17:
			o->chat = 1;
			break;
		case 18:
			o->question = optarg;
			o->chat = 1;
			break;
		case 19:
			o->print_tokens = 1;
			break;
		case 20:
			o->tokenize_lines = optarg;
			break;
		case 21:
			o->dump_logits = optarg;
			break;
		case 22:
			o->also = optarg;
			break;
		case 23:
			bad |= parse_u32(optarg, &o->params.span) < 0;
			break;
		case 'k':
			bad |= parse_u32(optarg, &o->params.kernel) < 0;
			break;
		case 4:
			bad |= parse_u32(optarg, &o->params.sinks) < 0;
			break;
		case 5:
			bad |= parse_u32(optarg, &o->reserve) < 0;
			break;
		case 6:
			o->compare = 1;
			break;
		case 7:
			o->socket = optarg;
			break;
		case 8:
			local = 1;
			break;
		case 10:
			bad |= parse_u32(optarg, &o->grow) < 0 || o->grow == 0;
			break;
		case 11:
			o->name = optarg;
			break;
		case 13:
			bad |= parse_range(optarg, &o->params) < 0;
			break;
		case 12:
			bad |= parse_u32(optarg, &o->pause_ms) < 0;
			break;
		case 14:
			o->print_positions = 1;
			break;
		case 'q':
			o->quiet = 1;
			break;
		case 1:
			policy = 1;
			if (!strcmp(optarg, "snapkv"))
				o->params.policy = SKV_POLICY_SNAPKV;
			else if (!strcmp(optarg, "h2o"))
				o->params.policy = SKV_POLICY_H2O;
			else if (!strcmp(optarg, "streamingllm"))
				o->params.policy = SKV_POLICY_STREAMINGLLM;
			else if (!strcmp(optarg, "window"))
				o->params.policy = SKV_POLICY_WINDOW;
			else if (!strcmp(optarg, "none"))
				policy = 0;
			else
				bad = 1;
			break;
		case 2:
			if (!strcmp(optarg, "avg"))
				o->params.pooling = SKV_POOL_AVG;
			else if (!strcmp(optarg, "max"))
				o->params.pooling = SKV_POOL_MAX;
			else
				bad = 1;
			break;
		case 3:
			if (!strcmp(optarg, "expand"))
				o->params.gqa = SKV_GQA_EXPAND;
			else if (!strcmp(optarg, "group"))
				o->params.gqa = SKV_GQA_GROUP;
			else
				bad = 1;
			break;
		case 9:
			if (!strcmp(optarg, "hnd"))
				o->layout = SKV_LAYOUT_HND;
			else if (!strcmp(optarg, "nhd"))
				o->layout = SKV_LAYOUT_NHD;
			else
				bad = 1;
			break;
		case 15: {
			struct skv_error e;

			o->budget = optarg;
			if (skv_budget_parse(optarg, &o->params, &e) < 0) {
				fprintf(stderr, "tiny-llama: --budget: %s\n", e.msg);
				bad = 1;
			}
			break;
		}
		case 16: {
			char *end;

			o->params.fallback_below = strtof(optarg, &end);
			bad |= *end != '\0' || end == optarg;
			break;
		}
		case 'h':
			usage(stdout);
			return 1;
		default:
			bad = 1;
		}
	}
	if (o->window_question && !o->chat) {
		fprintf(stderr, "tiny-llama: -W question needs --chat or --question\n");
		bad = 1;
	}
	if (bad || optind != argc) {
		usage(stderr);
		return -EINVAL;
	}
	o->backend = !policy ? BK_FULL : local ? BK_LOCAL : BK_DAEMON;
	skv_budget_defaults(&o->params);
	return 0;
}

struct gen {
	uint32_t *toks;
	uint32_t n;
	char *text;
	size_t len, cap;
};

/* Append a token's text to a growing string. */
static int gen_add(struct gen *g, const struct tl_tok *tok, uint32_t prev, uint32_t t)
{
	char piece[TL_TOK_MAX_PIECE + 8];
	size_t n = tl_tok_decode(tok, prev, t, piece, sizeof(piece));
	if (g->len + n + 1 > g->cap) {
		size_t nc = (g->cap ? g->cap * 2 : 256) + n;
		char *nb = realloc(g->text, nc);
		if (!nb)
			return -ENOMEM;
		g->text = nb;
		g->cap = nc;
	}
	memcpy(g->text + g->len, piece, n);
	g->len += n;
	g->text[g->len] = 0;
	g->toks[g->n++] = t;
	return 0;
}

/* One decoding sequence: the full cache, or a compact one (local or in the arena). */
struct lane {
	struct tl_kv *kv;
	struct tl_state *st;
	struct tl_rng rng;
	struct skv_cache *cache; /* daemon lane: the cache the view points into */
	struct gen g;
	uint32_t tok, prev;
	int done;
	uint32_t grows;
	uint32_t grow;
	struct tl_budget budget; /* --budget: what the mode chose */
};

/* Slots stored head h of layer l holds (ragged budget modes differ). */
static uint32_t head_kept(const struct tl_kv *kv, uint32_t l, uint32_t h)
{
	return kv->layers[l].head_len ? kv->layers[l].head_len[h] : kv->len;
}

/* A ragged cache's heads in the view: each head's offset from the layer's
 * row block, its own count (kept on the first call, kept + g after: a GROW
 * keeps them), and the slots of its longest head. */
static int view_ragged(struct tl_kv *kv, const struct skv_cache *c)
{
	const size_t n = (size_t)kv->n_layers * kv->h_store;
	const bool first = !kv->head_lens;

	if (first && (!(kv->head_lens = calloc(n, sizeof(uint32_t))) ||
		      !(kv->head_offs = calloc(n, sizeof(int64_t)))))
		return -ENOMEM;
	kv->cap = 0;
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		struct tl_kv_layer *L = &kv->layers[l];
		uint32_t *hl = kv->head_lens + (size_t)l * kv->h_store;
		int64_t *ho = kv->head_offs + (size_t)l * kv->h_store;

		for (uint32_t h = 0; h < kv->h_store; h++) {
			const float *k = skv_cache_k(c, l, h), *v = skv_cache_v(c, l, h);
			uint32_t cap = skv_cache_head_capacity(c, l, h);

			if (!k || !v || k - L->k != v - L->v)
				return -EPROTO;
			ho[h] = k - L->k;
			if (first)
				hl[h] = skv_cache_head_kept(c, l, h);
			kv->cap = cap > kv->cap ? cap : kv->cap;
		}
		L->head_off = ho;
		L->head_len = hl;
	}
	return 0;
}

/* Whether a cache keeps a different count per head (budget modes). */
static bool cache_ragged(const struct skv_cache *c)
{
	struct skv_cache_budget b = {.budget_size = sizeof(b)};

	return skv_cache_budget(c, &b) == 0 && b.ragged;
}

/* Point a view at the cache's current region (again after a GROW moved it). */
static int view_from_cache(struct tl_kv *kv, const struct skv_cache *c)
{
	const struct skv_cache_info *in = skv_cache_info(c);
	if (in->layers != kv->n_layers || in->h_store != kv->h_store ||
	    in->head_dim != kv->head_dim || in->dtype != SKV_DTYPE_F32)
		return -EPROTO;
	kv->cap = in->capacity;
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		struct tl_kv_layer *L = &kv->layers[l];
		L->k = skv_cache_k(c, l, 0);
		L->v = skv_cache_v(c, l, 0);
		L->head_stride = in->head_stride;
		L->token_stride = in->token_stride;
		L->pos = NULL; /* the daemon records positions on APPEND */
		if (!L->k || !L->v)
			return -EPROTO;
	}
	return cache_ragged(c) ? view_ragged(kv, c) : 0;
}

/*
 * Run one token through a lane's cache: GROW (or grow locally) when it is
 * full, write K/V at slot len and rotate at next_pos, then APPEND.
 */
static int lane_forward(const struct tl_model *m, struct lane *ln, uint32_t tok, const char **why)
{
	int r;
	struct tl_kv *kv = ln->kv;
	if (kv->len == kv->cap) {
		if (ln->cache) {
			if ((r = skv_cache_grow(ln->cache, ln->grow)) < 0) {
				*why = "GROW";
				return r;
			}
			if ((r = view_from_cache(kv, ln->cache)) < 0)
				return r;
		} else if ((r = tl_kv_grow(kv, kv->cap + ln->grow)) < 0) {
			return r;
		}
		ln->grows++;
	}
	/* a ragged cache's next slot is per head (head_len): the position is
	 * what all heads share */
	if (ln->cache && ((!kv->head_offs && skv_cache_next_slot(ln->cache) != kv->len) ||
			  skv_cache_next_position(ln->cache) != kv->next_pos)) {
		*why = "slot/position bookkeeping";
		return -EPROTO;
	}
	if ((r = tl_forward(m, ln->st, kv, tok, NULL)) < 0)
		return r;
	if (ln->cache && (r = skv_cache_append(ln->cache, 1)) < 0) {
		*why = "APPEND";
		return r;
	}
	return 0;
}

/*
 * Take the lane's pending token, then (unless it was the last) run it
 * through the model and pick the next one. Returns 1 when the lane ran a
 * forward (its logits are fresh), 0 when it stopped, -errno on failure.
 */
static int lane_step(const struct tl_model *m, struct lane *ln, int last, float temp, float *probs,
		     const char **why)
{
	int r;
	if (ln->done)
		return 0;
	if (ln->tok == m->tok->bos || ln->tok == m->tok->eos) {
		ln->done = 1; /* the story ended */
		return 0;
	}
	if ((r = gen_add(&ln->g, m->tok, ln->prev, ln->tok)) < 0)
		return r;
	if (last) {
		ln->done = 1;
		return 0;
	}
	if ((r = lane_forward(m, ln, ln->tok, why)) < 0)
		return r;
	ln->prev = ln->tok;
	ln->tok = tl_sample(tl_state_logits(ln->st), m->cfg.vocab_size, temp, &ln->rng, probs);
	return 1;
}

/* KL(p || q) of the softmaxes of two logit vectors, in nats. */
static double kl_div(const float *lp, const float *lq, uint32_t n)
{
	double mp = lp[0], mq = lq[0], sp = 0, sq = 0, k = 0;
	for (uint32_t i = 1; i < n; i++) {
		mp = fmax(mp, lp[i]);
		mq = fmax(mq, lq[i]);
	}
	for (uint32_t i = 0; i < n; i++) {
		sp += exp(lp[i] - mp);
		sq += exp(lq[i] - mq);
	}
	double zp = mp + log(sp), zq = mq + log(sq);
	for (uint32_t i = 0; i < n; i++)
		k += exp(lp[i] - zp) * ((lp[i] - zp) - (lq[i] - zq));
	return k;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(uint32_t ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* After decoding: every appended slot kept + g of every head holds L + g. */
static int check_positions(const struct skv_cache *c, uint32_t L)
{
	const struct skv_cache_info *in = skv_cache_info(c);
	for (uint32_t l = 0; l < in->layers; l++)
		for (uint32_t h = 0; h < in->h_store; h++) {
			const int32_t *pos = skv_cache_positions(c, l, h);
			/* budget modes: each head its own count */
			const uint32_t kept = skv_cache_head_kept(c, l, h);
			if (!pos)
				return -EPROTO;
			for (uint32_t i = 1; i < kept; i++)
				if (pos[i] <= pos[i - 1] || (uint32_t)pos[i] >= L)
					return -EPROTO;
			for (uint32_t g = 0; g < in->appended; g++)
				if (pos[kept + g] != (int32_t)(L + g))
					return -EPROTO;
		}
	return 0;
}

/* Every protected prompt position is among a head's kept positions (ascending). */
static int protected_kept(const struct skv_params *p, uint32_t L, const int32_t *pos, uint32_t kept)
{
	for (uint32_t r = 0; r < p->n_protected; r++)
		for (uint32_t x = p->protected_ranges[r].begin;
		     x < p->protected_ranges[r].end && x < L; x++) {
			uint32_t lo = 0, hi = kept;
			while (lo < hi) {
				uint32_t mid = lo + (hi - lo) / 2;
				if (pos[mid] < (int32_t)x)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (lo == kept || pos[lo] != (int32_t)x)
				return 0;
		}
	return 1;
}

/* What a compaction needs: the prefilled full cache and where it lives. */
struct compactor {
	const struct opts *o;
	const struct tl_model *m;
	const struct tl_kv *full; /* its first L slots hold the prompt */
	const float *q;
	uint32_t L, nq;
	struct skv_ctx *ctx;	   /* --local */
	struct skv_client *client; /* daemon */
	struct skv_buffer *buf;
	uint64_t kv_bytes; /* the queries follow the K/V in the buffer */
	/* through the daemon: the window of this compaction, its last n_q of
	 * the nq captured rows (--also-window); 0: nq and o->params */
	uint32_t nq_use;
	const struct skv_params *params;
};

/* What the daemon's budget mode chose, as tl_compact_budget() reports it;
 * a ragged view's length is its longest head. */
static void daemon_budget(struct lane *ln)
{
	struct skv_cache_budget b = {.budget_size = sizeof(b)};
	struct tl_kv *kv = ln->kv;

	skv_cache_budget(ln->cache, &b);
	ln->budget = (struct tl_budget){.c_star = b.c_star,
					.fallback = b.fallback,
					.min_mass = b.mass_min,
					.kept_min = UINT32_MAX};
	for (uint32_t l = 0; l < kv->n_layers; l++)
		for (uint32_t h = 0; h < kv->h_store; h++) {
			uint32_t n = skv_cache_head_kept(ln->cache, l, h);

			ln->budget.kept_total += n;
			ln->budget.kept_min = n < ln->budget.kept_min ? n : ln->budget.kept_min;
			ln->budget.kept_max = n > ln->budget.kept_max ? n : ln->budget.kept_max;
		}
	kv->len = ln->budget.kept_max;
}

/*
 * Compact the prompt into a new lane cache: in process, or by COMPACT to the
 * daemon and a view of the cache in the arena. The full cache may have been
 * decoded further: only its first L slots are read.
 */
static int compact_lane(const struct compactor *cp, struct lane *ln, const char **why)
{
	const struct tl_config *c = &cp->m->cfg;
	const uint32_t D = c->head_dim;
	int r;

	if (!cp->client) {
		struct skv_error serr = {0};
		struct skv_plan plan;
		/* tl_compact() wants a cache of exactly L tokens: a shallow view of the first L. */
		struct tl_kv pre = *cp->full;
		pre.len = pre.next_pos = cp->L;
		if (budgeted(&cp->o->params))
			r = tl_compact_budget(cp->ctx, cp->m, &pre, cp->q, cp->L - cp->nq, cp->nq,
					      &cp->o->params, cp->o->reserve, &ln->kv, &ln->budget,
					      &serr);
		else
			r = tl_compact(cp->ctx, cp->m, &pre, cp->q, cp->L - cp->nq, cp->nq,
				       &cp->o->params, cp->o->reserve, &ln->kv, &plan, &serr);
		if (r < 0)
			fprintf(stderr, "tiny-llama: compaction failed: %s\n", serr.msg);
		return r;
	}

	char *base = skv_buffer_data(cp->buf);
	struct skv_layer_ref *refs = calloc(c->n_layers, sizeof(*refs));
	const uint32_t nq = cp->nq_use ? cp->nq_use : cp->nq, skip = cp->nq - nq;
	if (!refs)
		return -ENOMEM;
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct tl_kv_layer *FL = &cp->full->layers[l];
		refs[l].q = (struct skv_tensor_ref){
		    .buf = cp->buf,
		    .offset = cp->kv_bytes +
			      ((uint64_t)l * c->n_heads * cp->nq + skip) * D * sizeof(float),
		    .dtype = SKV_DTYPE_F32,
		    .head_stride = (int64_t)cp->nq * D,
		    .token_stride = D};
		refs[l].k = (struct skv_tensor_ref){.buf = cp->buf,
						    .offset = (uint64_t)((char *)FL->k - base),
						    .dtype = SKV_DTYPE_F32,
						    .head_stride = FL->head_stride,
						    .token_stride = FL->token_stride};
		refs[l].v = refs[l].k;
		refs[l].v.offset = (uint64_t)((char *)FL->v - base);
	}
	struct skv_compact_desc d = {
	    .desc_size = sizeof(d),
	    .shape = {.prompt_len = cp->L,
		      .head_dim = D,
		      .h_q = c->n_heads,
		      .h_kv = c->n_kv_heads,
		      .n_q = nq},
	    .layers = c->n_layers,
	    .params = cp->params ? *cp->params : cp->o->params,
	    .layer = refs,
	    .out_layout = cp->o->layout,
	    .decode_reserve = cp->o->reserve,
	};
	r = skv_client_compact(cp->client, &d, &ln->cache);
	free(refs);
	if (r < 0) {
		*why = "COMPACT";
		return r;
	}
	const struct skv_cache_info *in = skv_cache_info(ln->cache);
	if ((r = tl_kv_new_view(c, in->h_store, in->capacity, &ln->kv)) < 0 ||
	    (r = view_from_cache(ln->kv, ln->cache)) < 0) {
		*why = "mapping the compact cache";
		return r;
	}
	ln->kv->len = in->kept;
	if (budgeted(&cp->o->params))
		daemon_budget(ln);
	/* Decoding resumes at logical position L, whatever was kept. */
	ln->kv->next_pos = skv_cache_next_position(ln->cache);
	if (ln->kv->next_pos != cp->L) {
		*why = "cache next position is not L";
		return -EPROTO;
	}
	return 0;
}

/*
 * The prompt's tokens: as given (with BOS when the model adds one), or in
 * the chat template: the head with the user's text, then the question and
 * the template's tail, encoded apart, so that -W question knows where the
 * question starts (its tokens do not merge with the text before a blank
 * line). -W question sets params.window from them.
 */
static int encode_prompt(struct opts *o, const struct tl_tok *tok, uint32_t *out, size_t max,
			 size_t *ret_n)
{
	size_t nh = 0, nt = 0, lp = strlen(o->prompt);
	char *head, *tail;
	int r;

	if (!o->chat)
		return tl_tok_encode(tok, o->prompt, tok->add_bos, out, max, ret_n);
	head = malloc(sizeof(CHAT_HEAD) + lp + 2);
	tail = malloc(sizeof(CHAT_TAIL) + strlen(o->question ? o->question : o->prompt));
	if (!head || !tail) {
		r = -ENOMEM;
		goto out;
	}
	/* without a question, the last user message is the whole prompt */
	sprintf(head, "%s%s%s", CHAT_HEAD, o->question ? o->prompt : "", o->question ? "\n\n" : "");
	sprintf(tail, "%s%s", o->question ? o->question : o->prompt, CHAT_TAIL);
	if ((r = tl_tok_encode(tok, head, 0, out, max, &nh)) < 0 ||
	    (r = tl_tok_encode(tok, tail, 0, out + nh, max - nh, &nt)) < 0)
		goto out;
	o->qwin = nt < QWIN_MIN ? QWIN_MIN : nt > QWIN_MAX ? QWIN_MAX : (uint32_t)nt;
	if (o->window_question)
		o->params.window = o->qwin;
	if (o->window_question && !o->quiet)
		fprintf(stderr,
			"tiny-llama: -W question: %zu tokens from the question on, W = %u\n", nt,
			o->params.window);
	*ret_n = nh + nt;
out:
	free(head);
	free(tail);
	return r;
}

/* Each line of path (without its newline) as token ids, one line each. */
static int tokenize_lines(const struct tl_tok *tok, const char *path)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	uint32_t *ids = NULL;
	size_t ids_cap = 0, nt;
	int r = 0;

	if (!f)
		return -errno;
	while ((n = getline(&line, &cap, f)) >= 0) {
		if (n && line[n - 1] == '\n')
			line[--n] = 0;
		if ((size_t)n + 2 > ids_cap) {
			uint32_t *ni = realloc(ids, sizeof(*ids) * ((size_t)n + 2));
			if (!ni) {
				r = -ENOMEM;
				break;
			}
			ids = ni;
			ids_cap = (size_t)n + 2;
		}
		if ((r = tl_tok_encode(tok, line, 0, ids, ids_cap, &nt)) < 0)
			break;
		for (size_t i = 0; i < nt; i++)
			printf(i ? " %u" : "%u", ids[i]);
		printf("\n");
	}
	free(line);
	free(ids);
	fclose(f);
	return r;
}

/* At most this many --also-window entries. */
#define MAX_ALSO 32
/* One --also-window entry: W, C (0: -C's), kernel and span (UINT32_MAX: -k's, --span's),
 * gqa (0: --gqa's). */
struct also {
	uint32_t w, cap, kernel, span;
	enum skv_gqa gqa;
};

/* An --also-window option after W: N% (C), kK (pooling width) or sS (span). */
static int parse_also_opt(char *t, uint32_t L, struct also *a)
{
	size_t n = strlen(t);
	uint32_t v;

	if (n >= 2 && t[n - 1] == '%') {
		t[n - 1] = 0;
		if (parse_u32(t, &v) < 0 || !v || v > 100)
			return -EINVAL;
		a->cap = (uint32_t)(((uint64_t)L * v + 50) / 100);
		return 0;
	}
	if (!strcmp(t, "group") || !strcmp(t, "expand")) {
		a->gqa = t[0] == 'g' ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
		return 0;
	}
	if ((t[0] != 'k' && t[0] != 's') || parse_u32(t + 1, &v) < 0)
		return -EINVAL;
	*(t[0] == 'k' ? &a->kernel : &a->span) = v;
	return 0;
}

/*
 * --also-window's list: W (a number, or question: the question's W), each
 * optionally /N% (C = N % of L, at least W + 1; else -C's), /kK (pooling
 * width), /sS (span) and /group or /expand; the kernels check k and s.
 */
static int parse_also(const struct opts *o, uint32_t L, struct also *out, uint32_t *ret_n)
{
	char buf[256], *save = NULL;

	*ret_n = 0;
	if (!o->also)
		return 0;
	if (o->backend != BK_DAEMON || o->params.policy != SKV_POLICY_SNAPKV ||
	    budgeted(&o->params) || strlen(o->also) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, o->also);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		struct also a = {0, 0, UINT32_MAX, UINT32_MAX, 0};
		char *slash = strchr(t, '/');
		uint32_t v;
		if (*ret_n == MAX_ALSO)
			return -EINVAL;
		while (slash) {
			char *next = strchr(slash + 1, '/');
			if (next)
				*next = 0;
			*slash = 0;
			if (parse_also_opt(slash + 1, L, &a) < 0)
				return -EINVAL;
			slash = next;
		}
		if (!strcmp(t, "question")) {
			if (!o->chat)
				return -EINVAL;
			v = o->qwin;
		} else if (parse_u32(t, &v) < 0 || v == 0 || v >= L) {
			return -EINVAL;
		}
		a.w = v;
		out[(*ret_n)++] = a;
	}
	return 0;
}

/*
 * One more compaction of the same prefill through the daemon, with window W
 * (the last W of the captured query rows) and the same C, decoded greedily
 * from the first token on; its text and compaction time are printed.
 */
/* The full cache's greedy tokens and the logits after each (--compare). */
struct tf_ref {
	const uint32_t *toks;
	const float *logits; /* [n][V] */
	uint32_t n, V;
	struct tl_state *st; /* scratch state for the teacher-forced lane */
};

/*
 * Teacher-forced on the full cache's text from a fresh compaction with
 * cp->params: top-1 agreements and the summed KL(full || compact).
 */
static int also_tf(const struct compactor *cp, const struct tf_ref *tf, uint32_t *agree, double *kl,
		   const char **why)
{
	struct lane lt = {.st = tf->st, .grow = cp->o->grow};
	int r = compact_lane(cp, &lt, why);

	*agree = 0;
	*kl = 0;
	for (uint32_t i = 0; r == 0 && i < tf->n; i++) {
		if ((r = lane_forward(cp->m, &lt, tf->toks[i], why)) < 0)
			break;
		const float *a = tl_state_logits(lt.st), *b = tf->logits + (size_t)i * tf->V;
		*agree += tl_argmax(a, tf->V) == tl_argmax(b, tf->V);
		*kl += kl_div(b, a, tf->V);
	}
	if (lt.cache && skv_cache_release(lt.cache) < 0 && r == 0) {
		r = -EIO;
		*why = "RELEASE";
	}
	tl_kv_free(lt.kv);
	return r;
}

static int also_window(struct compactor *cp, const struct also *a, uint32_t first_tok,
		       uint32_t prev, float *probs, const struct tf_ref *tf, const char **why)
{
	const struct opts *o = cp->o;
	struct skv_params p = o->params;
	struct lane ln = {.grow = o->grow, .tok = first_tok, .prev = prev};
	const uint32_t W = a->w, cap = a->cap;
	int r;

	p.window = W;
	if (a->kernel != UINT32_MAX)
		p.kernel = a->kernel;
	if (a->span != UINT32_MAX)
		p.span = a->span;
	if (a->gqa)
		p.gqa = a->gqa;
	if (cap)
		p.capacity = cap;
	if (o->keep_pct || cap)
		p.capacity = p.capacity > W ? p.capacity : W + 1;
	cp->params = &p;
	cp->nq_use = W;
	ln.g.toks = calloc(o->steps + 1, sizeof(uint32_t));
	if (!ln.g.toks || (r = tl_state_new(cp->m, &ln.st)) < 0) {
		free(ln.g.toks);
		return -ENOMEM;
	}
	double t0 = now_ms();
	r = compact_lane(cp, &ln, why);
	double t1 = now_ms();
	for (uint32_t i = 0; r >= 0 && i < o->steps && !ln.done; i++)
		r = lane_step(cp->m, &ln, i + 1 == o->steps, 0.0f, probs, why);
	uint32_t tf_agree = 0;
	double tf_kl = 0;
	if (r >= 0 && tf && tf->n)
		r = also_tf(cp, tf, &tf_agree, &tf_kl, why);
	if (r >= 0 && tf && tf->n)
		printf("--- window %u (C %u, compaction %.1f ms, teacher-forced %u/%u, KL %.4f): "
		       "%s\n",
		       W, p.capacity, t1 - t0, tf_agree, tf->n, tf_kl / tf->n,
		       ln.g.text ? ln.g.text : "");
	else if (r >= 0)
		printf("--- window %u (C %u, compaction %.1f ms): %s\n", W, p.capacity, t1 - t0,
		       ln.g.text ? ln.g.text : "");
	if (ln.cache && skv_cache_release(ln.cache) < 0 && r >= 0) {
		r = -EIO;
		*why = "RELEASE";
	}
	cp->params = NULL;
	tl_kv_free(ln.kv);
	tl_state_free(ln.st);
	free(ln.g.toks);
	free(ln.g.text);
	return r < 0 ? r : 0;
}

int main(int argc, char **argv)
{
	struct opts o = {0};
	struct tl_err err = {{0}};
	struct tl_model *m = NULL;
	struct tl_kv *full = NULL;
	struct skv_ctx *ctx = NULL;
	struct skv_client *client = NULL;
	struct skv_buffer *buf = NULL;
	struct lane lc = {0}, lf = {0}; /* compact, full */
	uint32_t *prompt = NULL;
	float *q = NULL, *probs = NULL, *full_logits = NULL;
	const char *why = NULL;
	size_t np = 0;
	int r;

	r = parse_opts(argc, argv, &o);
	if (r)
		return r > 0 ? 0 : 2;
	r = tl_model_load(o.model, &m, &err);
	if (r < 0) {
		fprintf(stderr, "tiny-llama: %s\n", err.msg);
		return 1;
	}
	const struct tl_config *c = &m->cfg;
	if (o.tokenize_lines) {
		r = tokenize_lines(m->tok, o.tokenize_lines);
		why = r < 0 ? "--tokenize-lines" : NULL;
		goto out;
	}
	size_t maxp = strlen(o.prompt) + (o.question ? strlen(o.question) : 0) + 256;
	prompt = calloc(maxp, sizeof(*prompt));
	probs = calloc(c->vocab_size, sizeof(float));
	lc.g.toks = calloc(o.steps + 1, sizeof(uint32_t));
	lf.g.toks = calloc(o.steps + 1, sizeof(uint32_t));
	if (!prompt || !probs || !lc.g.toks || !lf.g.toks || tl_state_new(m, &lc.st) < 0 ||
	    tl_state_new(m, &lf.st) < 0) {
		r = -ENOMEM;
		why = "allocation";
		goto out;
	}
	if ((r = encode_prompt(&o, m->tok, prompt, maxp, &np)) < 0) {
		why = "tokenizing the prompt";
		goto out;
	}
	if (o.print_tokens) {
		printf("tokens %zu:", np);
		for (size_t i = 0; i < np; i++)
			printf(" %u", prompt[i]);
		printf("\n");
		goto out;
	}
	const uint32_t L = (uint32_t)np, D = c->head_dim;
	if (o.keep_pct) {
		uint32_t cap = (uint32_t)(((uint64_t)L * o.keep_pct + 50) / 100);
		o.params.capacity = cap > o.params.window ? cap : o.params.window + 1;
	}
	struct also also[MAX_ALSO];
	uint32_t n_also = 0;
	if ((r = parse_also(&o, L, also, &n_also)) < 0) {
		why = "--also-window (snapkv through the daemon, with --chat for question)";
		goto out;
	}
	uint32_t nq = o.backend == BK_FULL ? 0 : tl_compact_n_q(&o.params, L);
	for (uint32_t i = 0; i < n_also; i++)
		nq = also[i].w > nq ? also[i].w : nq;
	const uint32_t full_cap = L + o.steps + 1;
	const uint64_t kv_bytes = tl_kv_bytes(c, c->n_kv_heads, full_cap);
	const uint64_t q_bytes = (uint64_t)c->n_layers * c->n_heads * nq * D * sizeof(float);
	if (L + o.steps > c->ctx_len && !o.quiet)
		fprintf(stderr,
			"tiny-llama: warning: %u tokens exceed the %u the model was "
			"trained on\n",
			L + o.steps, c->ctx_len);

	/* The full cache (and captured queries): own memory, or a registered memfd. */
	if (o.backend == BK_DAEMON) {
		struct skv_client_opts co = {.opts_size = sizeof(co), .name = o.name};
		if ((r = skv_client_connect(o.socket, &co, &client)) < 0) {
			fprintf(stderr, "tiny-llama: cannot connect to snapkvd%s%s: %s\n",
				o.socket ? " at " : "", o.socket ? o.socket : "", strerror(-r));
			fprintf(stderr, "tiny-llama: start snapkvd, or use --local\n");
			goto out;
		}
		if ((r = skv_buffer_alloc(client, kv_bytes + q_bytes, &buf)) < 0) {
			why = "registering the K/V buffer";
			goto out;
		}
		char *base = skv_buffer_data(buf);
		if ((r = tl_kv_new_view(c, c->n_kv_heads, full_cap, &full)) < 0 ||
		    (r = tl_kv_place(full, base, kv_bytes)) < 0)
			goto out;
		q = nq ? (float *)(base + kv_bytes) : NULL;
	} else {
		if ((r = tl_kv_new(c, c->n_kv_heads, full_cap, &full)) < 0)
			goto out;
		if (nq && !(q = calloc(q_bytes / sizeof(float), sizeof(float)))) {
			r = -ENOMEM;
			goto out;
		}
	}
	struct tl_qcap qcap = {.q = q, .first = L - nq, .n = nq};
	double t0 = now_ms();
	if ((r = tl_prefill(m, lf.st, full, prompt, L, nq ? &qcap : NULL)) < 0) {
		why = "prefill";
		goto out;
	}
	if (o.dump_logits) {
		FILE *f = fopen(o.dump_logits, "wb");
		if (!f || fwrite(tl_state_logits(lf.st), sizeof(float), c->vocab_size, f) !=
			      c->vocab_size) {
			r = -EIO;
			why = "--dump-logits";
		}
		if (f && fclose(f) && r == 0) {
			r = -EIO;
			why = "--dump-logits";
		}
		if (r < 0)
			goto out;
	}
	/* Both lanes start from the full prefill's logits and the same RNG state. */
	tl_rng_seed(&lf.rng, o.seed);
	lf.tok = tl_sample(tl_state_logits(lf.st), c->vocab_size, o.temp, &lf.rng, probs);
	const uint32_t first_tok = lf.tok;
	lf.prev = prompt[L - 1];
	lf.kv = full;
	lf.grow = o.grow;
	lc.rng = lf.rng;
	lc.tok = lf.tok;
	lc.prev = lf.prev;
	lc.grow = o.grow;

	struct compactor cp = {.o = &o,
			       .m = m,
			       .full = full,
			       .q = q,
			       .L = L,
			       .nq = nq,
			       .buf = buf,
			       .client = client,
			       .kv_bytes = kv_bytes,
			       .nq_use = tl_compact_n_q(&o.params, L)};
	if (o.backend != BK_FULL) {
		if (o.backend == BK_LOCAL && (r = skv_ctx_new(1, &ctx)) < 0) {
			why = "skv_ctx_new";
			goto out;
		}
		cp.ctx = ctx;
		double t1 = now_ms();
		if ((r = compact_lane(&cp, &lc, &why)) < 0)
			goto out;
		/* the TTFT overhead: compaction (COMPACT's round trip through the
		 * daemon, or libskv in process) against the prefill before it */
		if (!o.quiet)
			fprintf(stderr,
				"tiny-llama: timing: prefill %u tokens %.1f ms, compaction %.1f ms "
				"(C %u, W %u)\n",
				L, t1 - t0, now_ms() - t1, o.params.capacity, o.params.window);
	} else {
		lc.kv = full; /* no compaction: the full cache is the only lane */
	}
	if (o.backend != BK_FULL && !o.quiet) {
		uint32_t h = lc.kv->h_store;
		fprintf(
		    stderr,
		    "tiny-llama: %s: prompt %u tokens, compact cache keeps %u of %u per head x %u "
		    "heads (%s), %s\n",
		    o.backend == BK_DAEMON ? "snapkvd" : "local libskv", L, lc.kv->len, L, h,
		    h == c->n_heads ? "expand" : "group",
		    skv_policy_name(o.params.policy) ? skv_policy_name(o.params.policy) : "?");
	}
	if (budgeted(&o.params)) {
		const struct tl_budget *b = &lc.budget;
		const uint64_t heads = (uint64_t)c->n_layers * lc.kv->h_store;

		printf("--- budget %s%s: ", o.budget ? o.budget : "uniform",
		       o.params.fallback_below > 0.0f ? " with fallback" : "");
		if (o.params.budget_mode == SKV_BUDGET_MASS)
			printf("C* = %u, ", b->c_star);
		printf("kept per head %.1f mean (%u..%u) of %u, %.1f%% of the full cache, "
		       "smallest retained mass %.4f",
		       (double)b->kept_total / (double)heads, b->kept_min, b->kept_max, L,
		       100.0 * (double)b->kept_total / ((double)heads * L), (double)b->min_mass);
		if (b->fallback)
			printf("; below --fallback-below %g: FALLBACK, the full prompt is kept",
			       (double)o.params.fallback_below);
		printf("\n");
	}

	/* The kept positions, one line per layer and head (the Python engine
	 * examples/torch-paged prints the same lines; a test compares them). */
	for (uint32_t l = 0; o.print_positions && o.backend != BK_FULL && l < c->n_layers; l++)
		for (uint32_t h = 0; h < lc.kv->h_store; h++) {
			const int32_t *pos = lc.cache ? skv_cache_positions(lc.cache, l, h)
						      : lc.kv->layers[l].pos +
							    (size_t)h * lc.kv->layers[l].pos_stride;
			printf("positions layer %u head %u:", l, h);
			for (uint32_t i = 0; pos && i < head_kept(lc.kv, l, h); i++)
				printf(" %d", pos[i]);
			printf("\n");
		}

	if (o.backend != BK_FULL && o.params.n_protected) {
		/* Read the positions before decoding appends to them. */
		int ok = 1;
		for (uint32_t l = 0; l < c->n_layers; l++)
			for (uint32_t h = 0; h < lc.kv->h_store; h++) {
				const int32_t *pos =
				    lc.cache ? skv_cache_positions(lc.cache, l, h)
					     : lc.kv->layers[l].pos +
						   (size_t)h * lc.kv->layers[l].pos_stride;
				ok &= pos &&
				      protected_kept(&o.params, L, pos, head_kept(lc.kv, l, h));
			}
		printf("--- protected ranges: %s in every head of every layer\n",
		       ok ? "kept" : "NOT kept");
		if (!ok) {
			r = -EPROTO;
			why = "protected ranges";
			goto out;
		}
	}

	/* Decode both lanes in lockstep; compare logits while their tokens agree. */
	int compare = o.compare && o.backend != BK_FULL;
	if (!compare)
		lf.done = 1;
	uint32_t agree_prefix = 0, cmp_steps = 0, nfull = 0;
	const uint32_t V = c->vocab_size;
	if (compare && !(full_logits = calloc((size_t)o.steps * V, sizeof(float)))) {
		r = -ENOMEM;
		goto out;
	}
	int in_sync = 1, identical = 1;
	float max_diff = 0;
	for (uint32_t i = 0; i < o.steps; i++) {
		int last = i + 1 == o.steps;
		int rc = lane_step(m, &lc, last, o.temp, probs, &why);
		if (rc < 0) {
			r = rc;
			goto out;
		}
		int rf = lane_step(m, &lf, last, o.temp, probs, &why);
		if (rf < 0) {
			r = rf;
			goto out;
		}
		if (rf == 1)
			memcpy(full_logits + (size_t)nfull++ * V, tl_state_logits(lf.st),
			       V * sizeof(float));
		if (compare && in_sync && lc.g.n == lf.g.n && lc.g.n == i + 1 &&
		    lc.g.toks[i] == lf.g.toks[i]) {
			agree_prefix++;
			if (rc == 1 && rf == 1) {
				const float *a = tl_state_logits(lc.st),
					    *b = tl_state_logits(lf.st);
				identical &= !memcmp(a, b, c->vocab_size * sizeof(float));
				for (uint32_t v = 0; v < c->vocab_size; v++)
					max_diff = fmaxf(max_diff, fabsf(a[v] - b[v]));
				cmp_steps++;
			}
		} else {
			in_sync = 0;
		}
		if (lc.done && lf.done)
			break;
	}

	printf("%s%s\n", o.chat ? "" : o.prompt, lc.g.text ? lc.g.text : "");
	if (compare) {
		uint32_t same = 0, n = lc.g.n < lf.g.n ? lc.g.n : lf.g.n;
		for (uint32_t i = 0; i < n; i++)
			same += lc.g.toks[i] == lf.g.toks[i];
		printf("--- full cache:\n%s%s\n", o.chat ? "" : o.prompt,
		       lf.g.text ? lf.g.text : "");
		printf("--- agreement: %u of %u tokens agree (first %u identical)\n", same,
		       lc.g.n > lf.g.n ? lc.g.n : lf.g.n, agree_prefix);
		if (identical)
			printf("--- logits: bit-identical over %u decode steps\n", cmp_steps);
		else
			printf("--- logits: max |compact - full| %.3g over the first %u decode "
			       "steps\n",
			       max_diff, cmp_steps);
		/* Free-running texts drift apart after one different token; teacher
		 * forcing a fresh compact cache on the full text measures each step. */
		struct lane lt = {.st = lf.st, .grow = o.grow};
		uint32_t tf_agree = 0;
		double tf_kl = 0;
		if ((r = compact_lane(&cp, &lt, &why)) < 0)
			goto out;
		for (uint32_t i = 0; i < nfull && r == 0; i++) {
			if ((r = lane_forward(m, &lt, lf.g.toks[i], &why)) < 0)
				break;
			const float *a = tl_state_logits(lt.st), *b = full_logits + (size_t)i * V;
			tf_agree += tl_argmax(a, V) == tl_argmax(b, V);
			tf_kl += kl_div(b, a, V);
		}
		if (lt.cache && skv_cache_release(lt.cache) < 0 && r == 0)
			r = -EIO, why = "RELEASE";
		tl_kv_free(lt.kv);
		if (r < 0)
			goto out;
		printf(
		    "--- teacher-forced on the full text: %u of %u next-token predictions agree, "
		    "mean KL(full || compact) %.4f\n",
		    tf_agree, nfull, nfull ? tf_kl / nfull : 0.0);
	}
	const struct tf_ref tf = {lf.g.toks, full_logits, compare ? nfull : 0, V, lf.st};
	for (uint32_t i = 0; i < n_also; i++)
		if ((r = also_window(&cp, &also[i], first_tok, prompt[L - 1], probs, &tf, &why)) <
		    0)
			goto out;
	if (lc.cache) {
		const struct skv_cache_info *in = skv_cache_info(lc.cache);
		int pr = check_positions(lc.cache, L);
		printf("--- daemon cache %llu: L %u, kept %u, appended %u (slots %u..%u at "
		       "positions %u..%u: %s), capacity %u after %u GROW\n",
		       (unsigned long long)in->id, in->prompt_len, in->kept, in->appended, in->kept,
		       in->kept + in->appended - 1, L, L + in->appended - 1,
		       pr == 0 ? "ok" : "WRONG", in->capacity, lc.grows);
		if (pr < 0 || in->appended != lc.kv->len - in->kept) {
			r = -EPROTO;
			why = "daemon position table / APPEND count";
			goto out;
		}
		fflush(stdout);
		if (o.pause_ms)
			sleep_ms(o.pause_ms);
	}
out:
	if (r < 0 && why)
		fprintf(stderr, "tiny-llama: %s failed: %s%s%s\n", why, strerror(-r),
			client ? ": " : "", client ? skv_client_error(client) : "");
	if (lc.cache && skv_cache_release(lc.cache) < 0 && r == 0) {
		fprintf(stderr, "tiny-llama: RELEASE failed: %s\n", skv_client_error(client));
		r = -EIO;
	}
	if (lc.kv != full)
		tl_kv_free(lc.kv);
	tl_kv_free(full);
	free(lc.g.toks);
	free(lc.g.text);
	free(lf.g.toks);
	free(lf.g.text);
	tl_state_free(lc.st);
	tl_state_free(lf.st);
	free(prompt);
	free(probs);
	free(full_logits);
	if (!buf)
		free(q);
	skv_buffer_free(buf);
	skv_client_close(client);
	skv_ctx_free(ctx);
	tl_model_free(m);
	free(o.prompt_buf);
	return r < 0 ? 1 : 0;
}
