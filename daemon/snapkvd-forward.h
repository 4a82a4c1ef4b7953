/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-forward.h - the daemon's object types by name only, for headers
 * that pass pointers to them without needing their layout. Each object is
 * defined in its own header (snapkvd-<object>.h).
 */
#ifndef SNAPKVD_FORWARD_H
#define SNAPKVD_FORWARD_H

struct snapkvd_server;	  /* snapkvd-server.h */
struct snapkvd_loop;	  /* snapkvd-loop.h */
struct snapkvd_listener;  /* snapkvd-listener.h */
struct snapkvd_session;	  /* snapkvd-session.h */
struct snapkvd_origin;	  /* snapkvd-job.h */
struct snapkvd_job;	  /* snapkvd-job.h */
struct snapkvd_compactor; /* snapkvd-compactor.h */
struct snapkvd_groups;	  /* snapkvd-group.h */
struct snapkvd_group;	  /* snapkvd-group.h */
struct snapkvd_runner;	  /* snapkvd-runner.h */
struct snapkvd_device;	  /* snapkvd-device.h */
struct snapkvd_buffer;	  /* snapkvd-buffer.h */
struct snapkvd_cache;	  /* snapkvd-cache.h */
struct snapkvd_arena;	  /* snapkvd-arena.h */
struct snapkvd_pool;	  /* snapkvd-pool.h */
struct snapkvd_tenant;	  /* snapkvd-pool.h */
struct snapkvd_policy;	  /* snapkvd-policy.h */
struct snapkvd_config;	  /* snapkvd-config.h */
struct snapkvd_adminq;	  /* snapkvd-adminq.h */

#endif
