/*
 * Text for people, as devcoordctl reads and prints it and the coordinator's status page
 * shows it: durations typed on the command line ("500ms", "10s", "2m"), byte counts and ages
 * in tables ("80Gi", "12s", "3m"), and the word nearest to a typo ("did you mean
 * 'status'?"). Pure functions on caller-owned buffers; the JSON output keeps the raw numbers.
 */
#ifndef DEVCOORD_COMMON_HUMAN_H
#define DEVCOORD_COMMON_HUMAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A whole number followed by a unit, ms, s, m or h ("500ms", "10s", "2m", "1h"), as
 * milliseconds from 1 to UINT32_MAX. False for anything else (no unit, zero, a sign, a
 * fraction, trailing characters, too large). */
bool human_parse_duration(const char *text, uint32_t *ms);

/* A byte count in binary units as kubectl writes them: "512" below 1 KiB, then "80Gi",
 * "1.5Gi", "640Mi" (whole when exact, else one decimal). */
void human_bytes(char *buf, size_t cap, uint64_t bytes);

/* A span of milliseconds as an age: "850ms" below a second, "12s" below two minutes, "3m"
 * below two hours, "2h" below two days, then "5d". */
void human_age(char *buf, size_t cap, uint64_t ms);

/* A span of microseconds for the time an op took: "850us", "12.3ms", "4.56s", then as
 * human_age. */
void human_elapsed_us(char *buf, size_t cap, uint64_t us);

/* Edit distance of a and b: insertions, deletions, substitutions and swaps of two
 * neighbouring characters each count 1. Words longer than 64 bytes count as far apart. */
size_t human_edit_distance(const char *a, const char *b);

/* The candidate nearest to `word`, or NULL when none is near enough to be what was meant:
 * within one edit (two for words of five characters or more), else the only candidate that
 * starts with `word`. */
const char *human_nearest(const char *word, const char *const *candidates, size_t n);

#endif
