/* A program outside the tree, built against an installed libdevcoord (tests/install/run.sh):
 * the header, the library and its version agree, and calls work without a server. */
#include <stdio.h>
#include <string.h>

#include <devcoord/devcoord.h>

int
main(void)
{
    dc_client_options opts = { .fail_fast = true };
    dc_device_ref ref;
    dc_client *c;
    dc_status st;
    char text[DC_DEVICE_TEXT_SIZE];
    const char *in = "node-a/autodiff(cuda:3)";

    if (strcmp(dc_version(), "0.3.0") != 0 || DC_VERSION_MAJOR != 0) {
        fprintf(stderr, "version %s\n", dc_version());
        return 1;
    }
    if (dc_device_ref_parse(in, strlen(in), &ref, &st) != DC_OK ||
        dc_device_ref_format(&ref, text, sizeof(text)) != strlen(in) || strcmp(text, in) != 0) {
        fprintf(stderr, "device round trip: %s\n", st.message);
        return 1;
    }
    /* Nothing listens on port 1: the library says so instead of failing otherwise. */
    if (dc_client_open("tcp://127.0.0.1:1", &opts, &c, &st) != DC_UNAVAILABLE || !st.transport) {
        fprintf(stderr, "open: %s: %s\n", dc_status_name(st.code), st.message);
        return 1;
    }
    printf("libdevcoord %s: ok\n", dc_version());
    return 0;
}
