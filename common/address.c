#include "address.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

struct scheme {
    const char *prefix;
    bool tcp; /* HOST:PORT follows */
};

static const struct scheme schemes[] = {
    { "tcp://", true },  { "tls+tcp://", true }, { "tcp4://", true },
    { "tcp6://", true }, { "ipc://", false },    { "inproc://", false },
};

bool
address_port_valid(const char *text)
{
    unsigned long port = 0;
    size_t digits      = 0;

    for (; text[digits] >= '0' && text[digits] <= '9' && digits < 6; digits++) {
        port = port * 10 + (unsigned long)(text[digits] - '0');
    }
    return digits > 0 && text[digits] == '\0' && port <= 65535;
}

const char *
address_problem(const char *text)
{
    size_t len = strnlen(text, ADDRESS_MAX + 1);

    if (len > ADDRESS_MAX) {
        return "too long (at most 255 bytes)";
    }
    for (size_t i = 0; i < len; i++) {
        /* A newline or escape in an address would forge log lines and terminal output. */
        if (log_is_control((unsigned char)text[i])) {
            return "control character in address";
        }
    }
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        size_t n = strlen(schemes[i].prefix);
        const char *colon;

        if (strncmp(text, schemes[i].prefix, n) != 0) {
            continue;
        }
        if (text[n] == '\0') {
            return "nothing after the scheme";
        }
        if (!schemes[i].tcp) {
            return NULL;
        }
        if ((colon = strrchr(text + n, ':')) == NULL || !address_port_valid(colon + 1)) {
            return "expected HOST:PORT with a port from 0 to 65535";
        }
        return NULL;
    }
    return "unknown scheme (expected tcp://HOST:PORT, tls+tcp://HOST:PORT, ipc://PATH or "
           "inproc://NAME)";
}

size_t
address_split_list(const char *list, char *buf, size_t cap, const char **out, size_t max)
{
    size_t n = 0;
    char *p, *save = NULL;

    if (list == NULL || strlen(list) >= cap) {
        return 0;
    }
    memcpy(buf, list, strlen(list) + 1);
    for (p = strtok_r(buf, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
        if (n == max) {
            return 0;
        }
        out[n++] = p;
    }
    return n;
}

void
address_url(char *out, size_t cap, const char *scheme, const char *host, unsigned port)
{
    bool v6 = strchr(host, ':') != NULL;

    snprintf(out, cap, "%s://%s%s%s:%u", scheme, v6 ? "[" : "", host, v6 ? "]" : "", port);
}
