// SPDX-License-Identifier: MIT
/*
 * ctl-daemon.c - snapkvctl's online subcommands, answered by a running
 * snapkvd: status, caches, ledger (table or --json), metrics (Prometheus
 * text), and ctl_daemon_compact(), the daemon path of `snapkvctl compact`.
 *
 * The daemon is found at --socket PATH, else as proto/skv-socket.h says
 * ($SNAPKV_SOCKET, the system socket, $XDG_RUNTIME_DIR/snapkvd.sock).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl-admin.h"
#include "ctl-daemon.h"
#include "ctl-prom.h"
#include "proto/skv-ledger-json.h"
#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"
#include "proto/skv-io.h"
#include "proto/skv-socket.h"
#include "snapkv.h"
#include "snapkvctl.h"

/* One admin question (ctl-admin.c); the reason of a failure on stderr. */
/* Move the caches of page `more` to the end of reply r (more keeps none). */
static int append_page(Snapkv__V1__AdminReply *r, Snapkv__V1__AdminReply *more)
{
	Snapkv__V1__CacheLedger **cl;

	if (!more->n_caches)
		return 0;
	cl = realloc(r->caches, (r->n_caches + more->n_caches) * sizeof(*cl));
	if (!cl)
		return -ENOMEM;
	memcpy(cl + r->n_caches, more->caches, more->n_caches * sizeof(*cl));
	r->caches = cl;
	r->n_caches += more->n_caches;
	more->n_caches = 0;
	r->next_page_after = more->next_page_after;
	return 0;
}

/*
 * One admin question. The ledger and cache list come in pages (a page
 * always fits a frame): `one` asks for the one page after cache id
 * page_after; else every page is collected into one reply.
 */
static int admin_ask_page(const char *cmd, const char *path, Snapkv__V1__AdminKind kind, bool one,
			  uint64_t page_after, Snapkv__V1__AdminReply **ret, char *used)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *more;
	char err[900];
	int r;

	ar.kind = kind;
	ar.page_after = page_after;
	r = ctl_admin_call(path, &ar, ret, used, err, sizeof(err));
	while (r == 0 && !one && (*ret)->next_page_after) {
		ar.page_after = (*ret)->next_page_after;
		r = ctl_admin_call(path, &ar, &more, NULL, err, sizeof(err));
		if (r == 0) {
			r = append_page(*ret, more);
			if (r < 0)
				snprintf(err, sizeof(err), "out of memory");
			snapkv__v1__admin_reply__free_unpacked(more, NULL);
		}
		if (r < 0) {
			snapkv__v1__admin_reply__free_unpacked(*ret, NULL);
			*ret = NULL;
		}
	}
	if (r < 0)
		ctl_err(cmd, "%s", err);
	return r;
}

static int admin_ask(const char *cmd, const char *path, Snapkv__V1__AdminKind kind,
		     Snapkv__V1__AdminReply **ret, char *used)
{
	return admin_ask_page(cmd, path, kind, false, 0, ret, used);
}

static int parse_common(const char *cmd, int argc, char **argv, const char **sock, bool *json,
			const char *usage)
{
	static const struct option o[] = {{"socket", required_argument, NULL, 's'},
					  {"json", no_argument, NULL, 'j'},
					  {"help", no_argument, NULL, 'h'},
					  {0}};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "hs:", o, NULL)) != -1) {
		switch (c) {
		case 's':
			*sock = optarg;
			break;
		case 'j':
			if (!json) {
				ctl_err(cmd, "--json is not supported here");
				return CTL_EXIT_USAGE;
			}
			*json = true;
			break;
		case 'h':
			printf("%s", usage);
			return -1;
		default:
			fprintf(stderr, "%s", usage);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind != argc) {
		ctl_err(cmd, "unexpected argument \"%s\"", argv[optind]);
		return CTL_EXIT_USAGE;
	}
	return 0;
}

/* The transports actually used (buffers by kind, the arena): additive keys. */
static void transport_json(json_t *o, const Snapkv__V1__AdminReply *r)
{
	json_object_set_new(o, "buffers",
			    json_pack("{s:I, s:I, s:I}", "memfd", (json_int_t)r->buffers_memfd,
				      "cuda-vmm-fd", (json_int_t)r->buffers_cuda_vmm_fd, "cuda-ipc",
				      (json_int_t)r->buffers_cuda_ipc));
	json_object_set_new(o, "cuda_imports", json_integer(r->cuda_imports));
	json_object_set_new(o, "kv_pools", json_integer(r->kv_pools));
	json_object_set_new(o, "arena_transport",
			    ctl_json_str(r->arena_transport && r->arena_transport[0]
					     ? r->arena_transport
					     : "host-memfd"));
}

/* --backend cuda: every device the daemon opened and what it holds there. */
static void devices_json(json_t *o, const Snapkv__V1__AdminReply *r)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < r->n_devices; i++) {
		const Snapkv__V1__DeviceStatus *d = r->devices[i];

		json_array_append_new(
		    a, json_pack("{s:i, s:o, s:I, s:I, s:I, s:I, s:I}", "device", d->ordinal,
				 "name", ctl_json_str(d->name), "imports", (json_int_t)d->imports,
				 "import_bytes", (json_int_t)d->import_bytes, "arenas",
				 (json_int_t)d->arenas, "arena_bytes", (json_int_t)d->arena_bytes,
				 "compactions", (json_int_t)d->compactions));
	}
	if (a)
		json_object_set_new(o, "devices", a);
}

static void devices_text(const Snapkv__V1__AdminReply *r)
{
	char a[32], b[32];

	for (size_t i = 0; i < r->n_devices; i++) {
		const Snapkv__V1__DeviceStatus *d = r->devices[i];

		printf("  device %d  %s: %u imports (%s), %u GPU arenas (%s), %" PRIu64
		       " compactions\n",
		       d->ordinal, d->name, d->imports,
		       ctl_fmt_iec_fixed(d->import_bytes, a, sizeof(a)), d->arenas,
		       ctl_fmt_iec_fixed(d->arena_bytes, b, sizeof(b)), d->compactions);
	}
}

/* What clients may claim and what they hold (a daemon that says: 150+). */
static void limits_json(json_t *o, const Snapkv__V1__AdminReply *r)
{
	if (!r->max_sessions)
		return;
	json_object_set_new(
	    o, "limits",
	    json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "mapped_bytes",
		      (json_int_t)r->mapped_bytes, "max_mapped_bytes",
		      (json_int_t)r->max_mapped_bytes, "max_tenant_mapped_bytes",
		      (json_int_t)r->max_tenant_mapped_bytes, "max_tenant_buffers",
		      (json_int_t)r->max_tenant_buffers, "max_sessions",
		      (json_int_t)r->max_sessions, "max_sessions_per_tenant",
		      (json_int_t)r->max_sessions_per_tenant, "max_admin_sessions",
		      (json_int_t)r->max_admin_sessions, "handshakes", (json_int_t)r->handshakes,
		      "max_request_macs", (json_int_t)r->max_request_macs, "max_request_bytes",
		      (json_int_t)r->max_request_bytes));
}

static void limits_text(const Snapkv__V1__AdminReply *r)
{
	char a[32], b[32], c[32];

	if (!r->max_sessions)
		return;
	printf("  mapped    %s of %s (each tenant at most %s in %u buffers)\n",
	       ctl_fmt_iec_fixed(r->mapped_bytes, a, sizeof(a)),
	       ctl_fmt_iec_fixed(r->max_mapped_bytes, b, sizeof(b)),
	       ctl_fmt_iec_fixed(r->max_tenant_mapped_bytes, c, sizeof(c)), r->max_tenant_buffers);
	printf("  limits    %u sessions (%u per tenant), %u admin, %u in handshake; "
	       "%" PRIu64 " MACs, %s per request\n",
	       r->max_sessions, r->max_sessions_per_tenant, r->max_admin_sessions, r->handshakes,
	       r->max_request_macs, ctl_fmt_iec_fixed(r->max_request_bytes, a, sizeof(a)));
}

int ctl_status(int argc, char **argv)
{
	const char *sock = NULL;
	bool json = false;
	Snapkv__V1__AdminReply *r;
	char a[32], b[32], used[SKV_SOCKET_PATH_MAX];
	int rc = parse_common("status", argc, argv, &sock, &json,
			      "usage: snapkvctl status [--socket PATH] [--json]\n");

	if (rc)
		return rc < 0 ? CTL_EXIT_OK : rc;
	if (admin_ask("status", sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS, &r, used) < 0)
		return CTL_EXIT_FAIL;
	if (json) {
		json_t *o =
		    json_pack("{s:o, s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "version",
			      ctl_json_str(r->version), "pid", (json_int_t)r->pid, "backend",
			      ctl_json_str(r->backend), "uptime_ms", (json_int_t)r->uptime_ms,
			      "sessions", (json_int_t)r->sessions, "pool_total_bytes",
			      (json_int_t)r->pool_total, "pool_used_bytes",
			      (json_int_t)r->pool_used, "requests", (json_int_t)r->requests,
			      "errors", (json_int_t)r->errors, "workers", (json_int_t)r->workers,
			      "threads_per_worker", (json_int_t)r->threads_per_worker);

		if (o) {
			transport_json(o, r);
			limits_json(o, r);
			devices_json(o, r);
			/* issue 20: admin answers in slices, admin rate limits */
			json_object_set_new(o, "admin",
					    json_pack("{s:I, s:I, s:I}", "slices",
						      (json_int_t)r->admin_slices, "refused",
						      (json_int_t)r->admin_refused, "pending",
						      (json_int_t)r->admin_pending));
		}
		rc = ctl_json_print("status", o);
	} else {
		printf("snapkvd %s (pid %u) at %s\n", r->version, r->pid, used);
		printf("  backend   %s\n", r->backend);
		printf("  uptime    %.1f s\n", r->uptime_ms / 1000.0);
		printf("  sessions  %u\n", r->sessions);
		if (r->workers) /* an older daemon does not say */
			printf("  workers   %u x %u threads\n", r->workers, r->threads_per_worker);
		printf("  pool      %s used of %s\n", ctl_fmt_iec_fixed(r->pool_used, a, sizeof(a)),
		       ctl_fmt_iec_fixed(r->pool_total, b, sizeof(b)));
		printf("  requests  %" PRIu64 " (%" PRIu64 " errors)\n", r->requests, r->errors);
		printf("  buffers   memfd %u, cuda-vmm-fd %u, cuda-ipc %u (%u CUDA imports live)\n",
		       r->buffers_memfd, r->buffers_cuda_vmm_fd, r->buffers_cuda_ipc,
		       r->cuda_imports);
		printf("  kv pools  %u registered\n", r->kv_pools);
		printf("  arena     %s\n", r->arena_transport && r->arena_transport[0]
					       ? r->arena_transport
					       : "host-memfd");
		devices_text(r);
		limits_text(r);
		printf("  admin     %" PRIu64 " page slices built, %" PRIu64
		       " requests refused by a rate limit, %u pages being built\n",
		       r->admin_slices, r->admin_refused, r->admin_pending);
	}
	snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return rc;
}

static json_t *caches_json(const Snapkv__V1__AdminReply *r)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < r->n_caches; i++) {
		const Snapkv__V1__CacheLedger *c = r->caches[i];
		uint32_t hs = c->gqa == SNAPKV__V1__GQA__GQA_GROUP ? c->h_kv : c->h_q;

		if (json_array_append_new(
			a, json_pack("{s:I, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:o, s:o}",
				     "id", (json_int_t)c->id, "engine", ctl_json_str(c->engine),
				     "tenant", ctl_json_str(c->tenant), "layers",
				     (json_int_t)c->layers, "heads", (json_int_t)hs, "prompt_len",
				     (json_int_t)c->prompt_len, "kept", (json_int_t)c->kept,
				     "slots", (json_int_t)c->slots, "appended",
				     (json_int_t)c->appended, "gqa", skv_ledger_gqa_name(c->gqa),
				     "mass_min", ctl_json_real(c->mass_min), "mass_mean",
				     ctl_json_real(c->mass_mean))) < 0) {
			json_decref(a);
			return NULL;
		}
		skv_ledger_budget_json(json_array_get(a, json_array_size(a) - 1), c);
	}
	return a ? json_pack("{s:o}", "caches", a) : NULL;
}

/* Up to 16 values of a per-layer array, then how many more. */
static void put_layers_u64(const uint64_t *v, size_t n)
{
	for (size_t l = 0; l < n && l < 16; l++)
		printf("%s%" PRIu64, l ? "," : "", v[l]);
	if (n > 16)
		printf(",.. (%zu layers)", n);
}

static void put_layers_f(const float *v, size_t n)
{
	for (size_t l = 0; l < n && l < 16; l++)
		printf("%s%.3f", l ? "," : "", (double)v[l]);
	if (n > 16)
		printf(",.. (%zu layers)", n);
}

/* Per cache: its budget mode and outcome, and per layer the rows kept
 * (summed over heads) and the retained mass (min, mean). */
static void budget_lines(const Snapkv__V1__AdminReply *r)
{
	printf("\n%6s %s\n", "ID", "BUDGET");
	for (size_t i = 0; i < r->n_caches; i++) {
		const Snapkv__V1__CacheLedger *c = r->caches[i];

		printf("%6" PRIu64 " %s", c->id, skv_ledger_budget_name(c->budget_mode));
		if (c->budget_mode && c->c_star)
			printf(", C* %u", c->c_star);
		if (c->budget_mode)
			printf(", kept per head mean %.1f min %u%s%s", (double)c->kept_mean,
			       c->kept_min, c->ragged ? ", ragged" : "",
			       c->fallback ? ", fallback (full prompt kept)" : "");
		if (c->group_size)
			printf(", group \"%s\" of %u", c->group_key ? c->group_key : "",
			       c->group_size);
		printf("\n%6s layer kept ", "");
		put_layers_u64(c->layer_kept, c->n_layer_kept);
		printf("; mass min ");
		put_layers_f(c->layer_mass_min, c->n_layer_mass_min);
		printf("; mean ");
		put_layers_f(c->layer_mass_mean, c->n_layer_mass_mean);
		printf("\n");
	}
}

int ctl_caches(int argc, char **argv)
{
	const char *sock = NULL;
	bool json = false;
	Snapkv__V1__AdminReply *r;
	int rc = parse_common("caches", argc, argv, &sock, &json,
			      "usage: snapkvctl caches [--socket PATH] [--json]\n"
			      "The compact caches the daemon holds: shape, kept and appended\n"
			      "slots, retained mass, the budget mode and its outcome, and the\n"
			      "decision group (key, size) a cache was decided in, if any;\n"
			      "--json: {\"caches\": [...]}, same fields.\n");

	if (rc)
		return rc < 0 ? CTL_EXIT_OK : rc;
	if (admin_ask("caches", sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_CACHES, &r, NULL) < 0)
		return CTL_EXIT_FAIL;
	if (json) {
		rc = ctl_json_print("caches", caches_json(r));
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
		return rc;
	}
	printf("%6s %-16s %-10s %6s %6s %7s %7s %7s %6s %6s %8s %8s\n", "ID", "ENGINE", "TENANT",
	       "LAYERS", "HEADS", "L", "KEPT", "SLOTS", "G", "GQA", "MASSMIN", "MASSAVG");
	for (size_t i = 0; i < r->n_caches; i++) {
		const Snapkv__V1__CacheLedger *c = r->caches[i];
		uint32_t hs = c->gqa == SNAPKV__V1__GQA__GQA_GROUP ? c->h_kv : c->h_q;

		printf("%6" PRIu64 " %-16.16s %-10.10s %6u %6u %7u %7u %7u %6u %6s %8.4f %8.4f\n",
		       c->id, c->engine, c->tenant, c->layers, hs, c->prompt_len, c->kept, c->slots,
		       c->appended, skv_ledger_gqa_name(c->gqa), c->mass_min, c->mass_mean);
	}
	if (!r->n_caches)
		printf("(no caches)\n");
	else
		budget_lines(r);
	snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return CTL_EXIT_OK;
}

/* Byte columns of the ledger table: IEC units, or exact with --bytes. */
struct ledger_fmt {
	bool exact;
	int w;
};

static void put_bytes(const struct ledger_fmt *f, uint64_t b)
{
	char buf[32];

	if (f->exact)
		snprintf(buf, sizeof(buf), "%" PRIu64, b);
	else
		ctl_fmt_iec_fixed(b, buf, sizeof(buf));
	printf(" %*s", f->w, buf);
}

/* A size in the ledger's header line: "12.00 MiB", or "12582912 B" with --bytes. */
static const char *head_bytes(const struct ledger_fmt *f, uint64_t b, char *buf, size_t len)
{
	if (!f->exact)
		return ctl_fmt_iec_fixed(b, buf, len);
	snprintf(buf, len, "%" PRIu64 " B", b);
	return buf;
}

static void put_ratio(const Snapkv__V1__LedgerBytes *b)
{
	double x = skv_ledger_ratio(b);

	if (x < 0)
		printf(" %6s\n", "-");
	else
		printf(" %6.4f\n", x);
}

/* native-full, compact, index, reserved, real, allocated, ratio */
static void put_ledger(const struct ledger_fmt *f, const Snapkv__V1__LedgerBytes *b)
{
	static const Snapkv__V1__LedgerBytes zero = SNAPKV__V1__LEDGER_BYTES__INIT;

	if (!b)
		b = &zero;
	put_bytes(f, b->native_full);
	put_bytes(f, b->compact);
	put_bytes(f, b->index);
	put_bytes(f, b->reserved);
	put_bytes(f, b->real);
	put_bytes(f, b->allocated);
	put_ratio(b);
}

static void put_ledger_head(const struct ledger_fmt *f)
{
	printf(" %*s %*s %*s %*s %*s %*s %6s\n", f->w, "NATIVE_FULL", f->w, "COMPACT", f->w,
	       "INDEX", f->w, "RESERVED", f->w, "REAL", f->w, "ALLOCATED", "RATIO");
}

static void ledger_sum(Snapkv__V1__LedgerBytes *t, const Snapkv__V1__LedgerBytes *b)
{
	if (!b)
		return;
	t->native_full += b->native_full;
	t->compact += b->compact;
	t->index += b->index;
	t->reserved += b->reserved;
	t->real += b->real;
	t->allocated += b->allocated;
	t->padding += b->padding;
}

static void ledger_table(const Snapkv__V1__AdminReply *r, bool exact)
{
	struct ledger_fmt f = {.exact = exact, .w = exact ? 14 : 11};
	Snapkv__V1__LedgerBytes tt = SNAPKV__V1__LEDGER_BYTES__INIT;
	Snapkv__V1__LedgerBytes tc = SNAPKV__V1__LEDGER_BYTES__INIT;
	uint64_t ncache = 0, nused = 0;
	char a[32], b[32], c[32];

	printf("pool: %s used of %s (%.2f%%), %s reserved for admissions in flight, "
	       "%zu cache%s (%" PRIu64 " lingering)\n",
	       head_bytes(&f, r->pool_used, a, sizeof(a)),
	       head_bytes(&f, r->pool_total, b, sizeof(b)),
	       r->pool_total ? 100.0 * (double)r->pool_used / (double)r->pool_total : 0.0,
	       head_bytes(&f, r->pool_reserved, c, sizeof(c)), r->n_caches,
	       r->n_caches == 1 ? "" : "s", r->lingering_caches);

	printf("\n%-12s %6s %4s %6s %*s %*s", "TENANT", "UID", "SESS", "CACHES", f.w, "QUOTA", f.w,
	       "USED");
	put_ledger_head(&f);
	for (size_t i = 0; i < r->n_tenants; i++) {
		const Snapkv__V1__TenantInfo *t = r->tenants[i];

		printf("%-12.12s %6u %4" PRIu64 " %6" PRIu64, t->name, t->uid, t->sessions,
		       t->caches);
		if (t->quota_bytes)
			put_bytes(&f, t->quota_bytes);
		else
			printf(" %*s", f.w, "-");
		put_bytes(&f, t->used_bytes);
		put_ledger(&f, t->bytes);
		ledger_sum(&tt, t->bytes);
		ncache += t->caches;
		nused += t->used_bytes;
	}
	printf("%-12s %6s %4s %6" PRIu64 " %*s", "total", "", "", ncache, f.w, "");
	put_bytes(&f, nused);
	put_ledger(&f, &tt);

	printf("\n%5s %-12s %-8s %3s %4s %4s %4s %1s %7s %6s %6s %-6s %-9s", "ID", "ENGINE",
	       "TENANT", "N", "H_Q", "H_KV", "D", "S", "L", "C", "G", "GQA", "STATE");
	put_ledger_head(&f);
	for (size_t i = 0; i < r->n_caches; i++) {
		const Snapkv__V1__CacheLedger *x = r->caches[i];

		printf("%5" PRIu64 " %-12.12s %-8.8s %3u %4u %4u %4u %1u %7u %6u %6u %-6s %-9s",
		       x->id, x->engine, x->tenant, x->layers, x->h_q, x->h_kv, x->head_dim,
		       x->dtype_bytes, x->prompt_len, x->capacity, x->appended,
		       skv_ledger_gqa_name(x->gqa), x->lingering ? "lingering" : "held");
		put_ledger(&f, x->bytes);
		ledger_sum(&tc, x->bytes);
	}
	snprintf(a, sizeof(a), "%zu cache%s", r->n_caches, r->n_caches == 1 ? "" : "s");
	printf("%-5s %-81s", "total", a);
	put_ledger(&f, &tc);
	snprintf(a, sizeof(a), "%" PRIu64 " lingering", r->lingering_caches);
	printf("%-5s %-81s", "pool", a);
	put_ledger(&f, r->pool_bytes);
	if (r->n_caches)
		budget_lines(r);
	/* the transports each cache's inputs and arena really used */
	if (r->n_caches)
		printf("\n%5s %-24s %s\n", "ID", "TRANSPORT", "ARENA");
	for (size_t i = 0; i < r->n_caches; i++)
		printf("%5" PRIu64 " %-24s %s\n", r->caches[i]->id,
		       r->caches[i]->transport && r->caches[i]->transport[0]
			   ? r->caches[i]->transport
			   : "-",
		       r->caches[i]->arena_transport && r->caches[i]->arena_transport[0]
			   ? r->caches[i]->arena_transport
			   : "-");
}

int ctl_ledger(int argc, char **argv)
{
	static const struct option o[] = {
	    {"socket", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
	    {"bytes", no_argument, NULL, 'b'},	      {"page", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},	      {0}};
	static const char usage[] =
	    "usage: snapkvctl ledger [--socket PATH] [--json | --bytes] [--page AFTER]\n"
	    "--page AFTER: one page only, the caches with an id above AFTER (0 for\n"
	    "the first); the next page's AFTER goes to stderr. Without it every page\n"
	    "is fetched. A tenant sees its own caches; root and admin_uids see all.\n"
	    "Capacity ledger (SPEC.md) of every cache, per tenant and for the pool:\n"
	    "native-full, compact, index tables, reserved decode headroom, real (their\n"
	    "formula bytes: compact + index + reserved) and allocated (what the arena\n"
	    "really holds, alignment included), and compact / native-full. Sizes in\n"
	    "IEC units; --bytes prints exact byte counts, --json the whole ledger.\n";
	const char *sock = NULL;
	bool json = false, exact = false;
	Snapkv__V1__AdminReply *r;
	uint64_t page = 0;
	bool paged = false;
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "hs:", o, NULL)) != -1) {
		switch (c) {
		case 's':
			sock = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'b':
			exact = true;
			break;
		case 'p':
			page = strtoull(optarg, &end, 10);
			if (!*optarg || *end) {
				ctl_err("ledger",
					"--page takes a cache id (0: the first page), not \"%s\"",
					optarg);
				return CTL_EXIT_USAGE;
			}
			paged = true;
			break;
		case 'h':
			printf("%s", usage);
			return CTL_EXIT_OK;
		default:
			fprintf(stderr, "%s", usage);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind != argc) {
		ctl_err("ledger", "unexpected argument \"%s\"", argv[optind]);
		return CTL_EXIT_USAGE;
	}
	if (admin_ask_page("ledger", sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER, paged, page,
			   &r, NULL) < 0)
		return CTL_EXIT_FAIL;
	if (paged) {
		if (r->next_page_after)
			fprintf(stderr, "next page: --page %llu\n",
				(unsigned long long)r->next_page_after);
		else
			fprintf(stderr, "last page\n");
	}
	if (json) {
		c = ctl_json_print("ledger", skv_ledger_json(r));
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
		return c;
	} else {
		ledger_table(r, exact);
	}
	snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return CTL_EXIT_OK;
}

/* A sample's value: a number, or "+Inf", "-Inf", "NaN" as the text format
 * spells them (JSON has no such numbers). */
static json_t *sample_value(double v)
{
	if (isnan(v))
		return json_string("NaN");
	if (isinf(v))
		return json_string(v > 0 ? "+Inf" : "-Inf");
	return json_real(v);
}

static json_t *metrics_json(const struct ctl_prom *p)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < p->n; i++) {
		const struct ctl_prom_sample *m = &p->s[i];
		json_t *l = json_object();

		for (unsigned k = 0; l && k < m->n_labels; k++)
			if (json_object_set_new(l, m->labels[k].name,
						ctl_json_str(m->labels[k].value)) < 0) {
				json_decref(l);
				l = NULL;
			}
		if (!l || json_array_append_new(
			      a, json_pack("{s:o, s:o, s:o}", "name", ctl_json_str(m->name),
					   "labels", l, "value", sample_value(m->value))) < 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a ? json_pack("{s:o}", "samples", a) : NULL;
}

int ctl_metrics(int argc, char **argv)
{
	const char *sock = NULL;
	bool json = false;
	Snapkv__V1__AdminReply *r;
	struct ctl_prom p;
	size_t line = 0;
	int rc = parse_common(
	    "metrics", argc, argv, &sock, &json,
	    "usage: snapkvctl metrics [--socket PATH] [--json]\n"
	    "Prometheus text exposition of the daemon's metrics; --json: the\n"
	    "samples as {\"samples\": [{\"name\", \"labels\": {...}, \"value\"}]},\n"
	    "values that are not finite as the strings \"+Inf\", \"-Inf\", \"NaN\".\n");

	if (rc)
		return rc < 0 ? CTL_EXIT_OK : rc;
	if (admin_ask("metrics", sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS, &r, NULL) < 0)
		return CTL_EXIT_FAIL;
	if (!json) {
		fputs(r->text, stdout);
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
		return CTL_EXIT_OK;
	}
	rc = ctl_prom_parse(r->text ? r->text : "", r->text ? strlen(r->text) : 0, &p, &line);
	snapkv__v1__admin_reply__free_unpacked(r, NULL);
	if (rc < 0) {
		ctl_err("metrics", "the daemon's metrics do not parse (line %zu): %s", line,
			strerror(-rc));
		return CTL_EXIT_FAIL;
	}
	rc = ctl_json_print("metrics", metrics_json(&p));
	ctl_prom_free(&p);
	return rc;
}

/* Bytes of a strided [heads, tokens, D] view copied densely. */
static void pack_tensor(uint8_t *dst, const struct skv_tensor *t, uint32_t heads, uint32_t tokens,
			uint32_t d)
{
	size_t es = skv_dtype_size(t->dtype), row = (size_t)d * es;

	for (uint32_t h = 0; h < heads; h++)
		for (uint32_t i = 0; i < tokens; i++)
			memcpy(dst + ((size_t)h * tokens + i) * row,
			       (const uint8_t *)t->data +
				   ((size_t)h * t->head_stride + (size_t)i * t->token_stride) * es,
			       row);
}

/* Slot i of head h of an output view, strided or paged. */
static uint8_t *out_slot(const struct skv_tensor *t, uint32_t h, uint32_t i)
{
	int64_t el = (int64_t)h * t->head_stride;

	if (t->block_table)
		el += (int64_t)t->block_table[i / t->block_size] * t->block_stride +
		      (int64_t)(i % t->block_size) * t->token_stride;
	else
		el += (int64_t)i * t->token_stride;
	return (uint8_t *)t->data + el * (int64_t)skv_dtype_size(t->dtype);
}

/* skv_socket_search_run's try: a libsnapkv session at path. */
struct client_at {
	const struct skv_client_opts *opts;
	struct skv_client *c;
};

static int client_at(const char *path, void *arg)
{
	struct client_at *ca = arg;

	return skv_client_connect(path, ca->opts, &ca->c);
}

/* Where each layer's q (if any), k and v lie in the one input buffer, each
 * dense HND and 64-byte aligned: off[3 * l + 0..2]; the buffer's size. */
static size_t input_offsets(const struct skv_shape *shape, uint32_t n_layers,
			    const struct skv_layer_in *in, size_t *off)
{
	uint32_t D = shape->head_dim, L = shape->prompt_len, nq = shape->n_q;
	size_t total = 0;

	for (uint32_t l = 0; l < n_layers; l++) {
		size_t b[3] = {
		    nq ? (size_t)shape->h_q * nq * D * skv_dtype_size(in[l].q.dtype) : 0,
		    (size_t)shape->h_kv * L * D * skv_dtype_size(in[l].k.dtype),
		    (size_t)shape->h_kv * L * D * skv_dtype_size(in[l].v.dtype),
		};

		for (int t = 0; t < 3; t++) {
			off[3 * l + t] = total;
			total += (b[t] + 63) & ~(size_t)63;
		}
	}
	return total;
}

/* A libsnapkv session with the daemon at socket_path (NULL: the search),
 * the path that answered in used. 0 or -errno with the reason in err. */
static int connect_daemon(const char *socket_path, char *used, struct skv_client **ret, char *err,
			  size_t errlen)
{
	static const struct skv_client_opts opts = {.opts_size = sizeof(opts),
						    .name = "snapkvctl-compact"};
	struct client_at ca = {.opts = &opts};
	struct skv_socket_search search;
	unsigned at = 0;
	int r;

	r = skv_socket_search_init(&search, socket_path, "--socket");
	if (r == 0)
		r = skv_socket_search_run(&search, client_at, &ca, &at);
	if (r < 0) {
		ctl_admin_unreachable(&search, r, err, errlen);
		return r;
	}
	snprintf(used, SKV_SOCKET_PATH_MAX, "%s", search.c[at].path);
	*ret = ca.c;
	return 0;
}

/* The inputs copied into b at off (input_offsets), and the layer refs. */
static void pack_inputs(struct skv_buffer *b, const struct skv_shape *shape, uint32_t n_layers,
			const struct skv_layer_in *in, const size_t *off, struct skv_layer_ref *lr)
{
	uint32_t D = shape->head_dim, L = shape->prompt_len, nq = shape->n_q;
	uint8_t *base = skv_buffer_data(b);

	for (uint32_t l = 0; l < n_layers; l++) {
		const size_t *o = off + 3 * l;

		if (nq)
			pack_tensor(base + o[0], &in[l].q, shape->h_q, nq, D);
		pack_tensor(base + o[1], &in[l].k, shape->h_kv, L, D);
		pack_tensor(base + o[2], &in[l].v, shape->h_kv, L, D);
		lr[l].q = (struct skv_tensor_ref){b, o[0], in[l].q.dtype, (int64_t)nq * D, D, 0, 0};
		lr[l].k = (struct skv_tensor_ref){b, o[1], in[l].k.dtype, (int64_t)L * D, D, 0, 0};
		lr[l].v = (struct skv_tensor_ref){b, o[2], in[l].v.dtype, (int64_t)L * D, D, 0, 0};
	}
}

/* The compact cache into the caller's output views, each head's own count
 * (budget modes), and the outcome. */
static void copy_out(struct skv_cache *k, uint32_t n_layers, const struct skv_layer_out *out,
		     struct ctl_group *group, struct skv_budget_result *outcome)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	size_t row = (size_t)ci->head_dim * skv_dtype_size(ci->dtype);

	for (uint32_t l = 0; l < n_layers; l++)
		for (uint32_t h = 0; h < ci->h_store; h++) {
			uint32_t kh = skv_cache_head_kept(k, l, h);

			for (uint32_t i = 0; i < kh; i++) {
				memcpy(out_slot(&out[l].k, h, i), skv_cache_k_slot(k, l, h, i),
				       row);
				memcpy(out_slot(&out[l].v, h, i), skv_cache_v_slot(k, l, h, i),
				       row);
			}
			memcpy(out[l].positions + (size_t)h * out[l].pos_stride,
			       skv_cache_positions(k, l, h), (size_t)kh * 4);
			if (out[l].retained_mass)
				out[l].retained_mass[h] = skv_cache_retained_mass(k, l, h);
			if (outcome->kept)
				outcome->kept[(size_t)l * ci->h_store + h] = kh;
		}
	skv_cache_budget(k, &cb);
	outcome->c_star = cb.c_star;
	outcome->fallback = cb.fallback;
	outcome->min_mass = cb.mass_min;
	if (group) {
		group->decided_size = cb.group_size;
		group->wait_us = cb.group_wait_us;
	}
}

/* Submit d and wait by dl (the --timeout deadline, plus the group's):
 * 0 and *ret, or -errno with the reason in err. */
static int compact_wait(struct skv_client *c, const struct skv_compact_desc *d, uint64_t dl,
			const struct ctl_group *group, struct skv_cache **ret, char *err,
			size_t errlen)
{
	struct skv_request *rq = NULL;
	/* not skv_client_compact: --timeout bounds the compaction's wait too */
	int r = skv_compact_submit(c, d, &rq);

	if (r == 0) {
		r = skv_request_wait(rq, skv_io_poll_ms(dl), ret);
		if (r == -ETIMEDOUT) {
			/* the daemon keeps it until our session ends, which is now */
			skv_request_abandon(rq);
			snprintf(err, errlen, "snapkvd did not finish the compaction within %u ms",
				 ctl_admin_timeout_ms() +
				     (group && group->key ? group->timeout_ms : 0));
			return r;
		}
	}
	if (r < 0)
		snprintf(err, errlen, "%s", skv_client_error(c));
	return r;
}

int ctl_daemon_compact(const char *socket_path, char *used, const struct skv_shape *shape,
		       const struct skv_params *params, uint32_t n_layers,
		       const struct skv_layer_in *in, const struct skv_layer_out *out,
		       struct ctl_group *group, struct skv_budget_result *outcome, char *err,
		       size_t errlen)
{
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_cache *k = NULL;
	struct skv_layer_ref *lr = NULL;
	uint64_t dl = ctl_admin_deadline();
	struct skv_compact_desc d;
	size_t total, *off;
	float *scales;
	int r;

	off = calloc((size_t)n_layers * 3, sizeof(size_t));
	lr = calloc(n_layers, sizeof(*lr));
	scales = calloc((size_t)n_layers * 2, sizeof(float));
	if (!off || !lr || !scales) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	total = input_offsets(shape, n_layers, in, off);
	r = connect_daemon(socket_path, used, &c, err, errlen);
	if (r < 0)
		goto out;
	r = skv_buffer_alloc(c, total ? total : 64, &b);
	if (r < 0) {
		snprintf(err, errlen, "register buffer: %s", skv_client_error(c));
		goto out;
	}
	pack_inputs(b, shape, n_layers, in, off, lr);
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = *shape;
	d.layers = n_layers;
	d.params = *params;
	d.layer = lr;
	for (uint32_t l = 0; l < n_layers; l++) { /* fp8: the inputs' scales */
		scales[2 * l] = in[l].k.scale;
		scales[2 * l + 1] = in[l].v.scale;
	}
	d.kv_scales = scales;
	d.out_layout = SKV_LAYOUT_HND;
	if (out[0].k.block_table) { /* --out-layout paged: the daemon's arena blocks */
		d.out_layout = SKV_LAYOUT_PAGED;
		d.out_block_size = out[0].k.block_size;
	}
	if (group && group->key) {
		d.group_key = group->key;
		d.group_size = group->size;
		d.group_timeout_ms = group->timeout_ms;
		if (dl && group->timeout_ms)
			dl += (uint64_t)group->timeout_ms * 1000000u;
	}
	r = compact_wait(c, &d, dl, group, &k, err, errlen);
	if (r == 0)
		copy_out(k, n_layers, out, group, outcome);
out:
	skv_cache_release(k);
	skv_buffer_free(b);
	skv_client_close(c);
	free(off);
	free(lr);
	free(scales);
	return r;
}
