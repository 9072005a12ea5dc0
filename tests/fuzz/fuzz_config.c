/* The YAML loader of both daemons (design §9) on the raw bytes: config_coordinator_parse and
 * config_worker_parse. A refusal must name the file; what loads must hold well-formed values
 * (devices in canonical form, terminated strings), and everything must be freed. */
#include <string.h>

#include "config.h"
#include "device.h"
#include "fuzz.h"

#define NAME "fuzz.yaml"

static volatile size_t sink;

static void
check_refusal(dc_code code, const dc_status *st)
{
    fuzz_check_status(st);
    if (code != st->code || (code != DC_INVALID_ARGUMENT && code != DC_RESOURCE_EXHAUSTED)) {
        fuzz_finding("config refused with code %d (status %d): %s", (int)code, (int)st->code,
                     st->message);
    }
    if (strncmp(st->message, NAME ":", strlen(NAME ":")) != 0) {
        fuzz_finding("config error does not name the file: %s", st->message);
    }
}

static void
read_string(const char *s)
{
    sink += s != NULL ? strlen(s) : 0;
}

static void
read_tls(const struct config_tls *tls)
{
    read_string(tls->cert);
    read_string(tls->key);
    read_string(tls->ca);
}

static void
coordinator(const uint8_t *data, size_t size)
{
    struct config_coordinator cfg;
    dc_status st;
    dc_code code;

    memset(&cfg, 0, sizeof(cfg));
    status_clear(&st);
    if ((code = config_coordinator_parse(NAME, (const char *)data, size, &cfg, &st)) != DC_OK) {
        check_refusal(code, &st);
    } else {
        read_string(cfg.listen);
        read_string(cfg.http);
        read_string(cfg.tokens_file);
        read_string(cfg.state_dir);
        read_tls(&cfg.tls);
        if (autodiff_policy_name(cfg.autodiff) == NULL) {
            fuzz_finding("coordinator config loaded autodiff policy %d", (int)cfg.autodiff);
        }
    }
    config_coordinator_free(&cfg);
}

static void
worker(const uint8_t *data, size_t size)
{
    char text[DC_DEVICE_TEXT_SIZE];
    struct config_worker cfg;
    dc_device_ref ref;
    dc_status st;
    dc_code code;
    size_t n;

    memset(&cfg, 0, sizeof(cfg));
    status_clear(&st);
    if ((code = config_worker_parse(NAME, (const char *)data, size, &cfg, &st)) != DC_OK) {
        check_refusal(code, &st);
        config_worker_free(&cfg);
        return;
    }
    read_string(cfg.name);
    read_string(cfg.coordinator);
    read_string(cfg.listen);
    read_string(cfg.advertise);
    read_string(cfg.http);
    read_string(cfg.token_file);
    read_string(cfg.executor);
    read_tls(&cfg.tls);
    for (size_t i = 0; i < cfg.n_labels; i++) {
        read_string(cfg.labels[i].key);
        read_string(cfg.labels[i].value);
    }
    /* A configured device is one the grammar accepts: its text parses back to it. */
    for (size_t i = 0; i < cfg.n_devices; i++) {
        n = dc_device_format(&cfg.devices[i].device, text, sizeof(text));
        if (n >= sizeof(text) || dc_device_ref_parse(text, n, &ref, &st) != DC_OK ||
            ref.device.backend != cfg.devices[i].device.backend ||
            ref.device.kind != cfg.devices[i].device.kind ||
            ref.device.index != cfg.devices[i].device.index) {
            fuzz_finding("worker config device %zu ('%s') is not in canonical form", i, text);
        }
    }
    config_worker_free(&cfg);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    coordinator(data, size);
    worker(data, size);
    return 0;
}
