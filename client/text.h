/*
 * Reading comma lists as the CLI and dc_device_list_parse both do: blanks (space, tab)
 * around an entry belong to the list, not to the entry. Header-only, because the CLI links
 * nothing but libdevcoord's public API.
 */
#ifndef DEVCOORD_CLIENT_TEXT_H
#define DEVCOORD_CLIENT_TEXT_H

#include <stdbool.h>

static inline bool
text_is_blank(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* Narrows [*b, *e) to the entry inside its surrounding blanks. */
static inline void
text_trim(const char **b, const char **e)
{
    while (*b < *e && text_is_blank(**b)) {
        (*b)++;
    }
    while (*e > *b && text_is_blank((*e)[-1])) {
        (*e)--;
    }
}

#endif
