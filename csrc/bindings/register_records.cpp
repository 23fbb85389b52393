// Op records as plain dicts. Field names follow PyTorch's Flight Recorder where the
// concepts overlap (record_id, pg_id, collective_seq_id, p2p_seq_id, profiling_name,
// input/output sizes and dtypes, state, time_created_ns, ...), so FR tooling can
// read them; hetobs's own fields (bytes, peer, algorithm, busbw, ...) follow.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

#include "hetobs/collectives/digest.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/json.h"
#include "hetobs/common/wire.h"
#include "hetobs/record/recorder.h"
#include "hetobs/stats/layout.h"

#include <cstddef>
#include "register.h"

namespace py = pybind11;

namespace hetobs {
namespace bindings {
namespace {

py::dict recordDict(const OpRecord& r) {
  py::dict d;
  const char* op = opName(OpKind(r.op));
  const char* dt = dtypeName(DType(r.dtype));
  bool p2p = isP2P(OpKind(r.op));
  d["record_id"] = r.record_id;
  d["pg_id"] = r.comm_id;
  d["comm_id"] = r.comm_id;
  d["collective_seq_id"] = r.coll_seq;
  d["p2p_seq_id"] = r.p2p_seq;
  d["op"] = op;
  d["profiling_name"] = std::string("hetobs:") + op;
  d["input_sizes"] = py::make_tuple(py::make_tuple(r.count));
  d["output_sizes"] = py::make_tuple(py::make_tuple(r.out_count));
  d["input_dtypes"] = py::make_tuple(dt);
  d["output_dtypes"] = py::make_tuple(dt);
  d["dtype"] = dt;
  d["count"] = r.count;
  d["out_count"] = r.out_count;
  d["bytes"] = r.bytes;
  d["reduction"] = (OpKind(r.op) == OpKind::kAllReduce || OpKind(r.op) == OpKind::kReduce ||
                    OpKind(r.op) == OpKind::kReduceScatter)
                       ? py::object(py::str(redOpName(RedOp(r.redop))))
                       : py::object(py::none());
  d["root"] = (!p2p && r.root_or_peer >= 0) ? py::object(py::int_(r.root_or_peer)) : py::object(py::none());
  d["peer"] = p2p ? py::object(py::int_(r.root_or_peer)) : py::object(py::none());
  d["state"] = opStateName(OpState(r.state));
  d["algorithm"] = algorithmName(Algorithm(r.algorithm));
  d["backend"] = backendName(Backend(r.backend));
  d["device_type"] = utf8Valid(recordDevice(r));
  d["library"] = r.library[0] ? py::object(py::str(utf8Valid(r.library))) : py::object(py::none());
  d["comm_size"] = r.comm_size;
  d["comm_rank"] = r.comm_rank;
  d["time_created_ns"] = monoToWallNs(r.t_enqueue_ns);
  d["time_discovered_started_ns"] = r.t_start_ns ? py::object(py::int_(monoToWallNs(r.t_start_ns))) : py::none();
  d["time_discovered_completed_ns"] = r.t_end_ns ? py::object(py::int_(monoToWallNs(r.t_end_ns))) : py::none();
  d["duration_ms"] = (r.t_end_ns && r.t_start_ns) ? py::object(py::float_(double(r.t_end_ns - r.t_start_ns) / 1e6))
                                                   : py::object(py::none());
  d["algbw_gbps"] = r.algbw_gbps;
  d["busbw_gbps"] = r.busbw_gbps;
  // Who arrived last (record/arrival.h), as this rank heard it; None where not known.
  const bool known = (r.arrival_flags & kArrivalKnown) != 0;
  d["last_arrival_rank"] = known ? py::object(py::int_(r.last_arrival_rank)) : py::object(py::none());
  d["arrival_lag_ns"] = known ? py::object(py::int_(r.arrival_lag_ns)) : py::object(py::none());
  d["behind_first_ns"] = known ? py::object(py::int_(r.behind_first_ns)) : py::object(py::none());
  d["arrival_judged"] = known ? py::object(py::bool_((r.arrival_flags & kArrivalJudged) != 0)) : py::object(py::none());
  d["error"] = r.error[0] ? py::object(py::str(utf8Valid(r.error))) : py::object(py::none());
  // Hierarchical (island) ops only; None for every other op, so every record has the keys.
  if (r.island[0]) {
    d["island"] = std::string(r.island, strnlen(r.island, sizeof r.island));
    py::dict ph;
    ph["vendor_ns"] = r.phases.vendor_ns;
    ph["d2h_ns"] = r.phases.d2h_ns;
    ph["wire_ns"] = r.phases.wire_ns;
    ph["h2d_ns"] = r.phases.h2d_ns;
    ph["chunks"] = r.phases.chunks;
    d["phases"] = ph;
  } else {
    d["island"] = py::none();
    d["phases"] = py::none();
  }
  return d;
}

// Names of codes 0, 1, ... up to the first "invalid" (the name functions' answer past the end).
template <typename Code, typename NameOf>
py::tuple names(NameOf nameOf) {
  py::list out;
  for (int code = 0; code < 256; ++code) {
    const char* name = nameOf(Code(code));
    if (strcmp(name, "invalid") == 0) break;
    out.append(name);
  }
  return py::tuple(out);
}

// The codes, names and factors the Python side must not retype (hetobs/codes.py reads them here):
// the stats segment's layout version and bucket counts, and every code a record or a segment
// carries. Codes are append-only (record/op_record.h), so a name's position is its code.
void registerConstants(py::module_& m) {
  m.attr("STATS_LAYOUT_VERSION") = stats::kVersion;
  m.attr("LATENCY_BUCKETS") = stats::kLatencyBuckets;
  m.attr("BANDWIDTH_BUCKETS") = stats::kBandwidthBuckets;
  m.attr("LAG_BUCKETS") = stats::kLagBuckets;
  m.attr("OP_KINDS") = names<OpKind>(opName);
  m.attr("DTYPES") = names<DType>(dtypeName);
  py::list sizes;
  for (int t = 0; t < int(DType::kCount); ++t) sizes.append(dtypeSize(DType(t)));
  m.attr("DTYPE_SIZES") = py::tuple(sizes);
  m.attr("REDUCTIONS") = names<RedOp>(redOpName);
  m.attr("OP_STATES") = names<OpState>(opStateName);
  m.attr("ALGORITHMS") = names<Algorithm>(algorithmName);
  m.attr("BACKENDS") = names<Backend>(backendName);
  m.attr("DEVICE_TYPES") = names<DeviceType>(deviceTypeName);
  m.def(
      "busbw_factor",
      [](const std::string& op, int n) {
        for (int code = 0; code < int(OpKind::kCount); ++code)
          if (op == opName(OpKind(code))) return busBwFactor(uint8_t(code), n);
        throw py::value_error("op=" + op + ": not an op kind (hetobs._core.OP_KINDS)");
      },
      py::arg("op"), py::arg("n"),
      "nccl-tests' bus bandwidth factor of `op` over `n` ranks, as the recorder applies it (busbw = algbw x it).");
}

}  // namespace

void registerRecords(py::module_& m) {
  registerConstants(m);
  // The dump writer's text rules, for tests/test_native_json.py (no other caller).
  m.def("_json_escape", [](const py::bytes& s) { return py::bytes(jsonEscape(std::string(s))); },
        "The JSON string literal the dump writer makes of these bytes.");
  m.def("_utf8_prefix_len", [](const py::bytes& s, size_t max) {
    std::string t(s);
    return utf8PrefixLen(t.data(), t.size(), max);
  }, "How many of these bytes a text field of `max` bytes keeps.");
  m.def("records", [] {
    std::vector<OpRecord> snap;
    {
      py::gil_scoped_release nogil;
      snap = Recorder::instance().snapshot();
    }
    py::list out;
    for (const auto& r : snap) out.append(recordDict(r));
    return out;
  }, "Every op record of this process, oldest first.");
  m.def(
      "bench_digest",
      [](size_t bytes, long iters) {
        // What HETOBS_DIGEST adds to a sampled op besides its 8-byte exchange: one hash of the result.
        std::vector<uint8_t> buf(bytes);
        for (size_t i = 0; i < bytes; ++i) buf[i] = uint8_t(i * 131 + 7);
        uint64_t sink = 0;
        double best = 1e300;
        for (int round = 0; round < 5; ++round) {
          int64_t t0 = monoNs();
          for (long i = 0; i < iters; ++i) sink ^= digestBytes(buf.data(), bytes);
          best = std::min(best, double(monoNs() - t0) / double(iters));
        }
        volatile uint64_t keep = sink;
        (void)keep;
        return best;
      },
      py::arg("bytes"), py::arg("iterations") = 20,
      "ns per digest of `bytes` bytes (collectives/digest.h; best of 5 rounds).");
  m.def(
      "bench_recorder",
      [](long iters) {
        // Hot-path cost of one op's records (begin + started + finished, clock reads
        // included), best of 5 runs, in ns. Uses a private ring size-matched to the default.
        py::gil_scoped_release nogil;
        Recorder& r = Recorder::instance();
        OpRecord init{};
        init.op = uint8_t(OpKind::kAllReduce);
        init.dtype = uint8_t(DType::kFloat32);
        init.comm_size = 4;
        init.bytes = 1024;
        double best = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
          int64_t t0 = monoNs();
          for (long i = 0; i < iters; ++i) {
            int64_t now = monoNs();
            init.t_enqueue_ns = now;
            uint64_t id = r.begin(init);
            r.markStarted(id, now);
            r.markFinished(id, monoNs(), true, nullptr);
          }
          best = std::min(best, double(monoNs() - t0) / double(iters));
        }
        return best;
      },
      py::arg("iterations") = 1000000,
      "ns per op spent recording (writes into this process's recorder).");
  m.def("clock_ns", [] { return monoNs(); },
        "hetobs's monotonic clock in ns (what records are stamped with): CLOCK_MONOTONIC, read through the TSC "
        "where the kernel keeps time with it.");
  m.def("stats_layout", [] {
    // Offsets of the stats segment layout (stats/layout.h), for hetobs/stats.py's tests.
    py::dict d;
    using stats::StatsHeader;
    using stats::CommStats;
    using stats::LinkStats;
#define OFF(T, f) d[#T "." #f] = offsetof(T, f)
    OFF(StatsHeader, version); OFF(StatsHeader, comms_offset); OFF(StatsHeader, pid);
    OFF(StatsHeader, process_start_ticks); OFF(StatsHeader, job); OFF(StatsHeader, host);
    OFF(StatsHeader, hang_timeout_s); OFF(StatsHeader, heartbeat_ns); OFF(StatsHeader, last_progress_ns);
    OFF(StatsHeader, hangs_detected); OFF(StatsHeader, records_next); OFF(StatsHeader, state);
    OFF(StatsHeader, links_used); OFF(StatsHeader, wall_minus_mono_ns); OFF(StatsHeader, island);
    OFF(StatsHeader, island_vendor_ns); OFF(StatsHeader, island_ops); OFF(StatsHeader, island_device);
    OFF(StatsHeader, island_library); OFF(StatsHeader, boot_id);
    OFF(StatsHeader, hangs_suspected); OFF(StatsHeader, hangs_resolved);
    OFF(CommStats, comm_id); OFF(CommStats, coll_seq); OFF(CommStats, inflight_record); OFF(CommStats, failed);
    OFF(CommStats, ops);
    OFF(LinkStats, transport); OFF(LinkStats, counters); OFF(LinkStats, progress); OFF(LinkStats, health);
    OFF(OpRecord, record_id); OFF(OpRecord, algbw_gbps); OFF(OpRecord, root_or_peer); OFF(OpRecord, op);
    OFF(OpRecord, error); OFF(OpRecord, island); OFF(OpRecord, phases); OFF(OpRecord, device);
    OFF(OpRecord, library); OFF(OpRecord, last_arrival_rank); OFF(OpRecord, arrival_lag_ns);
    OFF(CommStats, arrivals_judged); OFF(CommStats, arrival_lag); OFF(CommStats, last_arrival_lag_ns);
#undef OFF
    d["sizeof.StatsHeader"] = sizeof(StatsHeader);
    d["sizeof.CommStats"] = sizeof(CommStats);
    d["sizeof.OpKindStats"] = sizeof(stats::OpKindStats);
    d["sizeof.LinkStats"] = sizeof(LinkStats);
    d["sizeof.OpRecord"] = sizeof(OpRecord);
    return d;
  });
  m.def("build_info", [] {
    py::dict d;
    d["version"] = HETOBS_VERSION;
    d["compiler"] = __VERSION__;
    d["record_bytes"] = sizeof(OpRecord);
    d["frame_header_bytes"] = sizeof(FrameHeader);
    return d;
  });
}

}  // namespace bindings
}  // namespace hetobs
