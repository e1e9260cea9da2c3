/* Printing a snapshot's whole map as it streams from the daemon (cli/map_print.c): plain,
 * --json or sha256sum lines, sorted by path. */
#ifndef COWBOX_CLI_MAP_PRINT_H
#define COWBOX_CLI_MAP_PRINT_H

#include <jansson.h>
#include <stddef.h>

struct map_row;

struct cli_map_printer {
	int json, sha256sum, started;
	long long rows;
	struct map_row *rows_buf; /* one frame's rows, reused */
	size_t rows_cap;
};

/* Print the map's opening (once; later calls do nothing). */
void cli_map_begin(struct cli_map_printer *p, long long turn);

/* Print the rows of a parsed "files" object (a reply's, from a daemon that does not stream). */
void cli_map_rows(struct cli_map_printer *p, json_t *files);

/* Print the rows of a "files" stream frame from its text, decoded in place (line is changed):
 * 1 when printed, 0 when the line is not such a frame (the caller parses it as JSON), or
 * -EPROTO with a message when it is one but malformed. */
int cli_map_frame_text(struct cli_map_printer *p, char *line);

/* Print the map's closing and free what p holds. */
void cli_map_end(struct cli_map_printer *p);

#endif
