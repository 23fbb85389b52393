#pragma once
// A rank killed by a catchable fatal signal (a scheduler's SIGTERM, SIGSEGV, SIGABRT...)
// runs no exit handler, so its rank file could never say how it ended. This records it:
// each time the runtime writes the rank file it also publishes the text the file would
// hold had the process died by a signal then, in three parts around the two numbers
// only known at that moment (the time and the signal). The handler writes them with
// async-signal-safe calls only (clock_gettime, open, write, rename) and then lets the
// signal take its default action, as it would have without them.
#include <string>

namespace hetobs {

// Handlers for SIGTERM, SIGHUP, SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, installed once
// and only where the action is the default (a handler installed later replaces them).
void installExitSignalRecorder();

// On a fatal signal, write `<head><wall ns><mid><signal><tail>` to `path` (via a temp file).
void publishSignalRecord(const std::string& path, const std::string& head, const std::string& mid,
                         const std::string& tail);

// The process is exiting normally (the exit status is recorded another way): write nothing.
void clearSignalRecord();

}  // namespace hetobs
