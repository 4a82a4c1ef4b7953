// SPDX-License-Identifier: MIT
/*
 * fuzz-config - libFuzzer target: a config file's text given to the
 * daemon's parser (snapkvd_config_parse, what snapkvd_config_load and
 * SIGHUP run), over the defaults.
 *
 * Properties: no read outside the text (it is not NUL-terminated, and a
 * malloc of exactly its size); the error message is always terminated and,
 * on failure, names a line; the defaults are left as they were on failure
 * (nothing half-applied); on success the allow lists stay within their
 * bounds, and the same text parses again to the same result.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-config.h"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-config: %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct snapkvd_config defaults, c, c2;
	struct skv_error err;
	char *text = malloc(size ? size : 1);
	uint64_t bytes;
	int r;

	REQUIRE(text);
	memcpy(text, data, size);
	snapkvd_config_defaults(&defaults);
	c = defaults;
	memset(&err, 'x', sizeof(err));
	r = snapkvd_config_parse(&c, text, size, &err);
	if (r < 0) {
		REQUIRE(memchr(err.msg, 0, sizeof(err.msg)));
		REQUIRE(err.msg[0]);
		REQUIRE(!memcmp(&c, &defaults, sizeof(c)));
	} else {
		REQUIRE(c.n_allow_uids <= SNAPKVD_MAX_ALLOW && c.n_allow_gids <= SNAPKVD_MAX_ALLOW);
		REQUIRE(memchr(c.socket_path, 0, sizeof(c.socket_path)));
		REQUIRE(memchr(c.backend, 0, sizeof(c.backend)));
		(void)snapkvd_config_allows(&c, 0, 0);
		(void)snapkvd_config_allows(&c, 1000, 1000);
		c2 = defaults;
		REQUIRE(snapkvd_config_parse(&c2, text, size, &err) == 0);
		REQUIRE(!memcmp(&c, &c2, sizeof(c)));
	}
	/* the size syntax the file uses, on the first line */
	{
		size_t n = 0;
		char line[64];

		while (n < size && n < sizeof(line) - 1 && text[n] != '\n' && text[n])
			n++;
		memcpy(line, text, n);
		line[n] = 0;
		(void)snapkvd_parse_size(line, &bytes);
	}
	free(text);
	return 0;
}
