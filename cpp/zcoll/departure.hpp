/*
 * Departure: a rank that leaves tells its peers at once.
 *
 * A rank whose interpreter ends (an uncaught exception, sys.exit, the end of the script, a
 * SIGTERM from mpiexec) while peers still wait for it in a node barrier would otherwise cost them
 * the whole timeout: its process stays alive inside MPI_Finalize, so the liveness check cannot
 * tell. Instead every live node barrier of the process is registered here, and on the way out
 * the rank announces its departure in each (node_barrier::depart: a word in shared memory and a
 * futex wake), from the interpreter's exit hooks or from a signal handler.
 *
 * The registry is a fixed array of atomic pointers, so the signal handler can walk it without
 * locks or allocation; a forked child, which inherits it, announces nothing for its parent. The
 * handler marks the departure, then hands the signal on to whatever was installed before it
 * (Python's own handler, or the default action, re-raised), so a program's behaviour on the signal
 * is unchanged apart from its peers learning of it. A handler installed after it (signal.signal in
 * the program) replaces it: the exit hooks still announce the departure if the interpreter exits
 * normally.
 */
#pragma once

#include "zcoll/barrier.hpp"

namespace zcoll {

// Registers a live barrier (false when the registry is full: the barrier then still works, its
// peers just learn of this rank's departure by the timeout).
bool watch_departure(node_barrier* barrier) noexcept;
// Unregisters it: call before the barrier is destroyed.
void unwatch_departure(node_barrier* barrier) noexcept;
// Announces this rank's departure in every registered barrier. Signal-safe.
void depart_everywhere(departure_reason reason, const char* text) noexcept;
// Installs the departure handler for `signo` once (later calls: nothing); returns false if
// sigaction failed.
bool install_departure_handler(int signo) noexcept;

}  // namespace zcoll
