#include "hetobs/observe/bw_log.h"

#include <unistd.h>

#include <algorithm>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/common/wire.h"
#include "hetobs/record/recorder.h"

namespace hetobs {
namespace {

std::string expand(const std::string& tpl, int rank, const std::string& host) {
  std::string out;
  for (size_t i = 0; i < tpl.size(); ++i) {
    if (tpl[i] == '%' && i + 1 < tpl.size()) {
      char c = tpl[++i];
      if (c == 'h') out += host;
      else if (c == 'p') out += std::to_string(getpid());
      else if (c == 'r') out += std::to_string(rank);
      else if (c == '%') out += '%';
      else out += std::string("%") + c;
    } else {
      out += tpl[i];
    }
  }
  return out;
}

}  // namespace

BwLogMode parseBwLogMode(const std::string& s) {
  if (s.empty() || s == "off" || s == "0") return BwLogMode::kOff;
  if (s == "verbose") return BwLogMode::kVerbose;
  if (s == "agg") return BwLogMode::kAgg;
  throw Error("HETOBS_BW_LOG='" + s + "': expected off, verbose or agg");
}

BwLog::BwLog(BwLogMode mode, double intervalS, const std::string& pathTemplate, int rank, const std::string& host)
    : mode_(mode), intervalNs_(secondsToNs(intervalS)), rank_(rank) {
  if (mode_ == BwLogMode::kOff) return;
  if (!pathTemplate.empty()) {
    std::string path = expand(pathTemplate, rank, host);
    out_ = fopen(path.c_str(), "a");
    if (!out_) HETOBS_WARN("HETOBS_BW_LOG_FILE=%s: cannot open (%s); logging to stderr", path.c_str(),
                           errnoString(errno).c_str());
    ownFile_ = out_ != nullptr;
  }
  if (!out_) out_ = stderr;
  nextRecord_ = Recorder::instance().nextId();
  windowStart_ = monoNs();
}

BwLog::~BwLog() {
  if (ownFile_) fclose(out_);
}

void BwLog::line(const std::string& s) {
  fputs(s.c_str(), out_);
  fputc('\n', out_);
}

void BwLog::poll(int64_t nowMono) { drain(nowMono, false); }
void BwLog::finish(int64_t nowMono) { drain(nowMono, true); }

void BwLog::drain(int64_t nowMono, bool final) {
  if (mode_ == BwLogMode::kOff) return;
  std::lock_guard<std::mutex> g(mu_);
  Recorder& rec = Recorder::instance();
  uint64_t end = rec.nextId();
  if (end > nextRecord_ + rec.capacity()) {
    skipped_ += end - rec.capacity() - nextRecord_;
    nextRecord_ = end - rec.capacity();
  }
  for (; nextRecord_ < end; ++nextRecord_) {
    OpRecord r{};
    if (!rec.get(nextRecord_, &r)) continue;
    if (r.state == uint8_t(OpState::kStarted) || r.state == uint8_t(OpState::kEnqueued)) break;  // not done yet
    if (r.state != uint8_t(OpState::kCompleted)) continue;
    double us = double(r.t_end_ns - r.t_start_ns) / 1e3;
    if (mode_ == BwLogMode::kVerbose) {
      bool p2p = isP2P(OpKind(r.op));
      line(strFormat("hetobs bw rank=%d comm=%llu %s=%llu op=%s bytes=%llu time_us=%.1f algbw_GBps=%.3f busbw_GBps=%.3f",
                     rank_, (unsigned long long)r.comm_id, p2p ? "p2p_seq" : "seq",
                     (unsigned long long)(p2p ? r.p2p_seq : r.coll_seq), opName(OpKind(r.op)),
                     (unsigned long long)r.bytes, us, r.algbw_gbps, r.busbw_gbps));
    } else {
      Agg& a = agg_[{r.comm_id, r.op}];
      a.min = a.count ? std::min(a.min, r.busbw_gbps) : r.busbw_gbps;
      a.max = a.count ? std::max(a.max, r.busbw_gbps) : r.busbw_gbps;
      a.count++;
      a.bytes += r.bytes;
      a.sum += r.busbw_gbps;
    }
  }
  if (mode_ == BwLogMode::kAgg && (final || nowMono - windowStart_ >= intervalNs_)) flushAgg(nowMono);
  if (skipped_) {
    line(strFormat("hetobs bw rank=%d skipped=%llu (ops finished faster than the log drained the record ring)", rank_,
                   (unsigned long long)skipped_));
    skipped_ = 0;
  }
  fflush(out_);
}

void BwLog::flushAgg(int64_t nowMono) {
  double secs = double(nowMono - windowStart_) / 1e9;
  for (auto& [key, a] : agg_) {
    if (!a.count) continue;
    line(strFormat("hetobs bw-agg rank=%d comm=%llu op=%s interval_s=%.1f count=%llu bytes=%llu busbw_GBps "
                   "mean=%.3f min=%.3f max=%.3f",
                   rank_, (unsigned long long)key.first, opName(OpKind(key.second)), secs,
                   (unsigned long long)a.count, (unsigned long long)a.bytes, a.sum / double(a.count), a.min, a.max));
  }
  agg_.clear();
  windowStart_ = nowMono;
}

}  // namespace hetobs
