/*
 * The one check of an nng address, for configs (listen, coordinator, advertise) and for the
 * data address a worker registers: a known scheme, something after it, a port in range
 * for the tcp family, no control characters, at most ADDRESS_MAX bytes. Pure: no nng call.
 */
#ifndef DEVCOORD_COMMON_ADDRESS_H
#define DEVCOORD_COMMON_ADDRESS_H

#include <stdbool.h>
#include <stddef.h>

#define ADDRESS_MAX 255 /* bytes an address may take */

/* NULL when text is a valid address, else why not, as a phrase for an error message. */
const char *address_problem(const char *text);

/* Whether text is a decimal port, 0 to 65535. */
bool address_port_valid(const char *text);

/* Splits "a,b,c" (as configs keep address lists) into at most max pointers into buf (a copy
 * of list, cap bytes); returns the count, 0 when it does not fit or names none. */
size_t address_split_list(const char *list, char *buf, size_t cap, const char **out, size_t max);

/* "scheme://host:port" into out (cap bytes), an IPv6 literal host (one with a ':') in
 * brackets. */
void address_url(char *out, size_t cap, const char *scheme, const char *host, unsigned port);

#endif
