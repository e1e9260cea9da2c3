/* Prints a snapshot's whole map as its frames stream in (plain, --json or sha256sum), sorted
 * by path without holding the map, reading the daemon's frames without building objects. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "cmd_common.h"
#include "map_print.h"

struct map_row {
	const char *path, *hash;
};

static int row_cmp(const void *a, const void *b)
{
	return strcmp(((const struct map_row *)a)->path, ((const struct map_row *)b)->path);
}

static void print_json_string(const char *text)
{
	json_t *j;
	char *out;

	/* Most names need no escape (jansson writes UTF-8 as it is): print them as they are
	 * instead of an allocation and an encoder run per row. */
	if (!text[strcspn(text, "\"\\\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f"
				"\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e"
				"\x1f\x7f")]) {
		putchar_unlocked('"');
		fputs_unlocked(text, stdout);
		putchar_unlocked('"');
		return;
	}
	j = json_string(text);
	out = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

	fputs(out ? out : "\"\"", stdout);
	free(out);
	json_decref(j);
}

/* What `sha256sum` prints for a name: names with \, newline or CR get a leading backslash on
 * the line and those bytes escaped (coreutils 9). */
static void print_sha256sum(const char *hash, const char *name)
{
	if (!strpbrk(name, "\\\n\r")) {
		fputs_unlocked(hash, stdout);
		fputs_unlocked("  ", stdout);
		fputs_unlocked(name, stdout);
		putchar_unlocked('\n');
		return;
	}
	printf("\\%s  ", hash);
	for (const char *p = name; *p; p++) {
		if (*p == '\\')
			fputs("\\\\", stdout);
		else if (*p == '\n')
			fputs("\\n", stdout);
		else if (*p == '\r')
			fputs("\\r", stdout);
		else
			putchar(*p);
	}
	putchar('\n');
}

void cli_map_begin(struct cli_map_printer *p, long long turn)
{
	if (p->started)
		return;
	p->started = 1;
	if (p->json)
		printf("{\"turn\":%lld,\"files\":{", turn);
	else if (!p->sha256sum)
		printf("turn %lld\n", turn);
}

/* n rows, sorted first unless they already are (the daemon sends them in path order). */
static void map_print_rows(struct cli_map_printer *p, struct map_row *rows, size_t n)
{
	for (size_t i = 1; i < n; i++)
		if (strcmp(rows[i - 1].path, rows[i].path) > 0) {
			qsort(rows, n, sizeof(*rows), row_cmp);
			break;
		}
	for (size_t i = 0; i < n; i++) {
		const char *h = rows[i].hash ? rows[i].hash : "";

		if (p->json) {
			if (p->rows++)
				putchar_unlocked(',');
			print_json_string(rows[i].path);
			putchar_unlocked(':');
			print_json_string(h);
		} else if (p->sha256sum) {
			print_sha256sum(h, rows[i].path);
		} else {
			fputs_unlocked(cli_q(rows[i].path), stdout); /* no forged rows */
			fputs_unlocked("  ", stdout);
			fputs_unlocked(h, stdout);
			putchar_unlocked('\n');
		}
	}
}

void cli_map_rows(struct cli_map_printer *p, json_t *files)
{
	size_t n = json_object_size(files), i = 0;
	const char *k;
	json_t *v;

	json_object_foreach(files, k, v)
	{
		if (cb_grow(&p->rows_buf, &p->rows_cap, i, sizeof(struct map_row), 2048,
			    "snapshot rows"))
			return;
		p->rows_buf[i].path = k;
		p->rows_buf[i++].hash = json_string_value(v);
	}
	map_print_rows(p, p->rows_buf, n);
}

static const char *skip_space(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
		s++;
	return s;
}

static int hex4(const char *s, unsigned *out)
{
	*out = 0;
	for (int i = 0; i < 4; i++) {
		char c = s[i];
		unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
			     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
			     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
						    : 16u;
		if (d > 15)
			return -1;
		*out = *out << 4 | d;
	}
	return 0;
}

/* Decode the JSON string that starts at *s (its opening quote) in place: the decoded text
 * (UTF-8, NUL-terminated) starts at the returned pointer, *s moves past the closing quote.
 * Decoding never outgrows the escaped text, so the NUL lands inside it. NULL if malformed or
 * if it holds a NUL (no path does). */
static char *json_string_in_place(char **s)
{
	char *in = *s, *start, *out;

	if (*in != '"')
		return NULL;
	start = out = ++in;
	for (;;) {
		unsigned char c = (unsigned char)*in;

		if (c == '"')
			break;
		if (c < 0x20)
			return NULL; /* a raw control byte, or the line ended */
		if (c != '\\') {
			*out++ = *in++;
			continue;
		}
		unsigned cp;

		switch (in[1]) {
		case '"':
		case '\\':
		case '/':
			*out++ = in[1];
			in += 2;
			continue;
		case 'b':
			cp = '\b';
			break;
		case 'f':
			cp = '\f';
			break;
		case 'n':
			cp = '\n';
			break;
		case 'r':
			cp = '\r';
			break;
		case 't':
			cp = '\t';
			break;
		case 'u':
			if (hex4(in + 2, &cp))
				return NULL;
			in += 4;
			if (cp >= 0xd800 && cp < 0xdc00) {
				unsigned lo;

				if (in[2] != '\\' || in[3] != 'u' || hex4(in + 4, &lo) ||
				    lo < 0xdc00 || lo > 0xdfff)
					return NULL;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				in += 6;
			} else if (cp >= 0xdc00 && cp < 0xe000) {
				return NULL;
			}
			break;
		default:
			return NULL;
		}
		in += 2;
		if (!cp)
			return NULL;
		if (cp < 0x80) {
			*out++ = (char)cp;
		} else if (cp < 0x800) {
			*out++ = (char)(0xc0 | cp >> 6);
			*out++ = (char)(0x80 | (cp & 0x3f));
		} else if (cp < 0x10000) {
			*out++ = (char)(0xe0 | cp >> 12);
			*out++ = (char)(0x80 | (cp >> 6 & 0x3f));
			*out++ = (char)(0x80 | (cp & 0x3f));
		} else {
			*out++ = (char)(0xf0 | cp >> 18);
			*out++ = (char)(0x80 | (cp >> 12 & 0x3f));
			*out++ = (char)(0x80 | (cp >> 6 & 0x3f));
			*out++ = (char)(0x80 | (cp & 0x3f));
		}
	}
	*s = in + 1;
	*out = '\0';
	return start;
}

int cli_map_frame_text(struct cli_map_printer *p, char *line)
{
	static const char files_key[] = "\"files\":{";
	char *s = strstr(line, "\"stream\":\"files\",\"turn\":"), *end;
	long long turn;
	size_t n = 0;

	/* The daemon writes this head and no other key after it (daemon/ops_turns.c); a frame
	 * of another shape is the caller's to parse as JSON. */
	if (!s)
		return 0;
	s += strlen("\"stream\":\"files\",\"turn\":");
	errno = 0;
	turn = strtoll(s, &end, 10);
	if (errno || end == s ||
	    strncmp(end,
		    ","
		    "\"files\":{",
		    strlen(files_key) + 1))
		return 0;
	s = end + 1 + strlen(files_key);
	for (s = (char *)skip_space(s); *s != '}';) {
		char *path, *hash;

		if (!(path = json_string_in_place(&s)))
			goto bad;
		s = (char *)skip_space(s);
		if (*s++ != ':')
			goto bad;
		s = (char *)skip_space(s);
		if (!(hash = json_string_in_place(&s)))
			goto bad;
		int ret = cb_grow(&p->rows_buf, &p->rows_cap, n, sizeof(struct map_row), 2048,
				  "snapshot rows");

		if (ret)
			return ret;
		p->rows_buf[n].path = path;
		p->rows_buf[n++].hash = hash;
		s = (char *)skip_space(s);
		if (*s == ',')
			s = (char *)skip_space(s + 1);
		else if (*s != '}')
			goto bad;
	}
	cli_map_begin(p, turn);
	map_print_rows(p, p->rows_buf, n);
	return 1;
bad:
	return cb_error_set(EPROTO, "the daemon sent a malformed map frame");
}

void cli_map_end(struct cli_map_printer *p)
{
	if (p->json && p->started) /* a map that never began (a failed request) has no end */
		puts("}}");
	free(p->rows_buf);
	p->rows_buf = NULL;
	p->rows_cap = 0;
}
