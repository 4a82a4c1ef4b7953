/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-control.h - a session's control-socket face: the armed recvmsg,
 * framing (one frame per message, never a trusted length), the guard that
 * closes every fd a frame carried unless a handler took it, and each
 * message to its handler: HELLO to the session, REGISTER and UNREGISTER to
 * the session's buffer set, REQUEST to the dispatcher, ADMIN passed
 * through to snapkvd-admin.c, CUDA_ARENA to the device. It sits above the
 * session and the dispatcher: nothing below it calls it.
 */
#ifndef SNAPKVD_CONTROL_H
#define SNAPKVD_CONTROL_H

#include "snapkvd-forward.h"

/* Arm the first recvmsg of a new session (snapkvd_session_new). 0, or the
 * session is closed and -errno returned. */
int snapkvd_control_start(struct snapkvd_session *s);

#endif
