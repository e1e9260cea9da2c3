/* Private to the vm backend: the state of a workspace's VM (backends/vm.c boots and stops it)
 * and the relay that multiplexes commands over its one agent port (backends/vm_relay.c). */
#ifndef COWBOX_BACKENDS_VM_H
#define COWBOX_BACKENDS_VM_H

#include <pthread.h>
#include <stdint.h>

#include "cowbox/exec.h"
#include "cowbox/image.h"

#define VM_MAX_RUNNING 256

/* One command: a host process (the agent binary's --client mode, which the runner supervises)
 * whose connection to the relay carries the command's frames. */
struct vm_cmd {
	uint32_t id;	   /* 0: a free slot */
	struct cb_exec *h; /* the client's runner handle (set once exec has it) */
	char *run;	   /* the run frame's JSON, sent when the client connects; then NULL */
	int fd;		   /* the client's connection (-1: not yet, or closed) */
	int connected;	   /* it came (the run frame went to the guest) */
	int closed;	   /* the relay let go of it */
	int waited;	   /* vm_wait is done with the slot */
	int pending_kill;  /* a kill before the client connected */
	int killed;	   /* vm_kill was called */
	/* the guest's last frame */
	int exited, failed;
	int exit_code, term_signal, timed_out, output_limited, oom_killed;
	char msg[256];
};

struct vm_state {
	char dir[4096];	       /* <workspace dir>/vm */
	char sockdir[64];      /* /tmp/cowbox-vm-XXXXXX (0700): agent.sock, run.sock */
	int kvm;	       /* -accel kvm (else TCG) */
	struct cb_exec *qemu;  /* qemu under the runner */
	pthread_t qemu_thread; /* waits for qemu; sets dead */
	int qemu_started;      /* qemu_thread runs */
	struct cb_exec_result qemu_res;
	int agent_fd;  /* the chardev of the agent's port (qemu's socket) */
	int listen_fd; /* the relay's socket, sockdir/run.sock */
	int wake[2];   /* wakes the relay thread: a new command, qemu's end, close */
	pthread_t relay_thread;
	int relay_started;
	pthread_mutex_t lock;  /* guards cmds, next_id, dead, stopping */
	pthread_mutex_t wlock; /* one writer of frames on agent_fd at a time */
	struct vm_cmd cmds[VM_MAX_RUNNING];
	uint32_t next_id;
	int dead;	  /* qemu ended or the port broke */
	int stopping;	  /* close began */
	char *agent;	  /* the agent binary (its --client mode runs each command) */
	char kernel[256]; /* what the agent's hello said */
	struct cb_backend_image_config image; /* the image's Env (commands start from it) */
	/* network all (backends/vm_net.c) */
	struct cb_exec *passt; /* passt under the runner; NULL: no NIC */
	char net_dir[64];      /* /tmp/cowbox-net-XXXXXX, nobody's: passt.sock */
	char net_sock[96];
	char net_append[256]; /* the kernel command line's cowbox.net= and cowbox.dns= */
};

/* Start the relay thread over s->agent_fd (connected, the hello read) and s->listen_fd. */
int vm_relay_start(struct vm_state *s);
/* Stop it and close every client connection (after qemu is gone or going). */
void vm_relay_stop(struct vm_state *s);
/* Reserve a slot for a command whose run frame is run (taken over, also on failure); *id. */
int vm_relay_reserve(struct vm_state *s, char *run, uint32_t *id);
/* The slot of id gets the client's handle h (NULL: exec failed, the slot is released). */
void vm_relay_started(struct vm_state *s, uint32_t id, struct cb_exec *h);
/* Send a kill frame for the command of h (or keep it for when its client connects). */
void vm_relay_kill(struct vm_state *s, struct cb_exec *h, int sig);
/* After the runner's wait of h: what the guest said in *out (a copy), the slot released.
 * Returns 0, or -ENOENT when h is no command of ours. */
int vm_relay_finish(struct vm_state *s, struct cb_exec *h, struct vm_cmd *out);
/* Write one frame to the agent (serialised with every other writer). */
int vm_relay_send(struct vm_state *s, uint32_t id, uint8_t type, const void *buf, size_t len);
/* Wake the relay thread (qemu ended). */
void vm_relay_wake(struct vm_state *s);

/* ---- boot material (backends/vm_boot.c) ---- */

/* The cache setup-vm fills: vm/vmlinuz, vm/modules.cpio.gz, rootfs-bookworm
 * ($COWBOX_IMAGE_CACHE, else /var/cache/cowbox). */
const char *vm_cache(void);
/* Whether to boot with KVM: COWBOX_VM_ACCEL=kvm|tcg decides; else /dev/kvm must open and make
 * a VM and no daemon since the host's boot may have seen it fail to boot the guest. */
int vm_kvm_usable(void);
/* Note, for the host's other daemons until it reboots, that KVM did not boot the guest. */
void vm_kvm_mark_broken(void);
/* The agent binary (malloc'd in *out): COWBOX_VM_AGENT, else beside the cowbox binary. */
int vm_find_agent(char **out);
/* Write the initrd at path: setup-vm's modules cpio, then agent as /init. */
int vm_make_initrd(const char *agent, const char *path);
/* SIGKILL the qemu a crashed daemon left in dir (its pid file; its command line names dir). */
void vm_kill_leftover(const char *dir);

/* ---- network all (backends/vm_net.c) ---- */

/* Start passt for s (network all): the host's address, prefix and gateway for the guest (in
 * s->net_append, for the agent), no port forwarded in, the host's loopback out of reach; it
 * listens on s->net_sock for qemu's one connection and ends with it. */
int vm_net_start(struct vm_state *s);
/* End passt if it still runs and remove its socket's directory (idempotent). */
void vm_net_stop(struct vm_state *s);

/* The agent binary's --client mode: connect to the relay at sock as command id, then stdin
 * to the command, its output to 1 and 2, its exit code as ours. */
int cb_vm_client_main(const char *sock, const char *id);

#endif
