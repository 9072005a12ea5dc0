/*
 * The coordinator's call link (README "SubmitOp on the call link"): a raw stream port
 * (common/datalink.h) on which a trainer sends its SubmitOp as the RPC request frame it
 * would put on the socket, and reads the reply frame back, with no nng socket, protocol or
 * context between them. Each frame is served by the RPC server as if it had come on the
 * socket: the same token check, limits, handlers and metrics.
 */
#ifndef DEVCOORD_CALLLINK_H
#define DEVCOORD_CALLLINK_H

#include <stdatomic.h>
#include <stdint.h>

#include "devcoord/v1/devcoord.pb-c.h"
#include "rpc.h"
#include "status.h"

struct config_coordinator;
struct call_link;

/* Listens on cfg's listen host at call_link.port. *out NULL (and DC_OK) when the link is
 * off: call_link.enabled false, or a listener other than tcp://. */
dc_code call_link_start(const struct config_coordinator *cfg, struct call_link **out,
                        dc_status *st);
/* Frames are served by rpc from now on (until then they are answered UNAVAILABLE). */
void call_link_serve(struct call_link *l, struct rpc_server *rpc);
/* CallLink's answer: the port and secret, or port 0 when l is NULL. */
void call_link_describe(const struct call_link *l, Devcoord__V1__CallLinkResponse *out);
/* Frames served so far. */
uint64_t call_link_calls(struct call_link *l);
/* Closes the port and every connection. A connection waiting for its call's answer keeps
 * waiting: the calls must have been made to answer (ops_shutdown) first. */
void call_link_free(struct call_link *l);

#endif
