/*
 * Calls to one of several coordinators, following their leader (state.backend etcd,
 * issue 16). A follower refuses every call UNAVAILABLE with "leader: ADDR" in its message;
 * a coordinator that cannot be reached is skipped. Which calls go again, and where:
 *
 * - refused by a follower (it ran nothing): again, to the leader it names when that is one
 *   of the list, else to the next address; "no leader elected yet" waits 100 ms first;
 * - only a connected address is called; while none is, the call waits (within its
 *   timeout) for one to connect;
 * - anything else, including a connection lost after the call was sent or no reply in
 *   time: answered as it is, since the call may have run (no silent resend). The next
 *   call starts at the next address.
 *
 * All within the call's one timeout. Every address has its own rpc_client, dialing in the
 * background from the start, so whether one is connected is known without waiting.
 */
#ifndef DEVCOORD_COMMON_RPC_LEADER_H
#define DEVCOORD_COMMON_RPC_LEADER_H

#include <stdbool.h>
#include <stddef.h>

#include "rpc.h"

#define RPC_LEADER_MAX 8 /* addresses (config CONFIG_ENDPOINTS_MAX) */

struct rpc_leader;

/* Opens a client to url (dialing in the background). */
typedef dc_code (*rpc_leader_open_fn)(void *arg, const char *url, struct rpc_client **out,
                                      dc_status *st);

/* list: "a,b,c" (each already a checked address). */
dc_code rpc_leader_new(const char *list, rpc_leader_open_fn open, void *arg,
                       struct rpc_leader **out, dc_status *st);
void rpc_leader_free(struct rpc_leader *l);

dc_code rpc_leader_call(struct rpc_leader *l, const ProtobufCServiceDescriptor *svc,
                        unsigned method, const ProtobufCMessage *request, uint32_t timeout_ms,
                        struct rpc_reply *reply, dc_status *st);

/* The address calls go to first now. */
const char *rpc_leader_current(const struct rpc_leader *l);
/* Whether the current address is connected. */
bool rpc_leader_connected(const struct rpc_leader *l);

/* Exposed for tests: the address after "leader: " in a follower's message, into buf;
 * false when there is none. */
bool rpc_leader_hint(const char *message, char *buf, size_t cap);

#endif
