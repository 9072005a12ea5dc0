// The public header is includable from C++.
#include <devcoord/devcoord.h>

int
main()
{
    dc_status st;
    dc_device_ref ref;
    return dc_device_ref_parse("cuda:0", 6, &ref, &st) == DC_OK ? 0 : 1;
}
