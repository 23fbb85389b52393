// Endpoint, Communicator and Work. Every call that can block releases the GIL, so
// Python threads (a watchdog, an exporter) keep running while a collective waits.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/comm/communicator.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/observe/external_comm.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/dump_tree.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/relay/copy_lane.h"
#include "hetobs/relay/device_lane_hooks.h"
#include "hetobs/relay/relay.h"
#include "fast_entry.h"
#include "register.h"

namespace py = pybind11;

namespace hetobs {
namespace bindings {
namespace {

OpArgs makeArgs(int op, uintptr_t sptr, size_t scount, uintptr_t rptr, size_t rcount, int dtype, int redop, int root,
                double timeout, int size) {
  if (op < 0 || op >= int(OpKind::kCount)) throw py::value_error("invalid op code " + std::to_string(op));
  if (dtype < 0 || dtype >= int(DType::kCount)) throw py::value_error("invalid dtype code " + std::to_string(dtype));
  if (redop < 0 || redop >= int(RedOp::kCount)) throw py::value_error("invalid reduction code " + std::to_string(redop));
  OpKind k = OpKind(op);
  if (k == OpKind::kRelay) throw py::value_error("relay runs through Communicator.relay(), not run()");
  bool rooted = k == OpKind::kBroadcast || k == OpKind::kReduce || isP2P(k);
  if (rooted && (root < 0 || root >= size))
    throw py::value_error("root/peer " + std::to_string(root) + " is not a rank of this communicator");
  OpArgs a;
  a.op = k;
  a.dtype = DType(dtype);
  a.redop = RedOp(redop);
  a.root_or_peer = root;
  a.send = reinterpret_cast<const uint8_t*>(sptr);
  a.send_count = scount;
  a.recv = reinterpret_cast<uint8_t*>(rptr);
  a.recv_count = rcount;
  a.timeout_s = timeout;
  return a;
}


// An async relay: its completion and, once complete, what it measured.
struct RelayWork {
  std::shared_ptr<Work> work;
  std::shared_ptr<RelayRequest> request;
};

py::dict phasesDict(const RelayPhases& p) {
  py::dict d;
  d["d2h_ns"] = p.d2h_ns;
  d["wire_ns"] = p.wire_ns;
  d["h2d_ns"] = p.h2d_ns;
  d["wall_ns"] = p.wall_ns;
  d["chunks"] = p.chunks;
  d["bytes_sent"] = p.bytes_sent;
  d["bytes_recv"] = p.bytes_recv;
  return d;
}

using MessageList = std::vector<std::tuple<int, uintptr_t, size_t>>;  // (peer, address, bytes)

std::shared_ptr<RelayRequest> makeRelay(const Communicator& c, const MessageList& sends, const MessageList& recvs,
                                        int stage, bool pipeline, size_t chunk, size_t slots, int device,
                                        uintptr_t cudaStream, int deviceType, py::object deviceStream) {
  if (stage < 0 || stage > int(RelayStage::kDevice)) throw py::value_error("invalid relay stage code " + std::to_string(stage));
  if (stage == int(RelayStage::kDevice) && (deviceType < 0 || device < 0))
    throw py::value_error("relay stage 'device' needs the buffers' device type and index");
  if (chunk < 1) throw py::value_error("relay chunk_bytes must be at least 1");
  if (slots < 1) throw py::value_error("relay slots must be at least 1");
  auto r = std::make_shared<RelayRequest>();
  r->stage = RelayStage(stage);
  r->pipeline = pipeline;
  r->chunk_bytes = chunk;
  r->slots = slots;
  r->device = device;
  r->cuda_stream = reinterpret_cast<void*>(cudaStream);
  r->device_type = deviceType;
  if (!deviceStream.is_none()) {
    r->device_stream = deviceStream.cast<int64_t>();
    r->order_after_stream = true;
  }
  for (const auto& pair : {std::make_pair(&sends, &r->sends), std::make_pair(&recvs, &r->recvs)}) {
    for (const auto& [peer, addr, bytes] : *pair.first) {
      if (peer < 0 || peer >= c.size() || peer == c.rank())
        throw py::value_error("relay peer " + std::to_string(peer) + " is not another rank of this communicator");
      pair.second->push_back(RelayMessage{peer, reinterpret_cast<uint8_t*>(addr), bytes});
    }
  }
  return r;
}

py::dict linkDict(const LinkInfo& l) {
  py::dict d;
  d["peer"] = l.peer;
  d["global_peer"] = l.global_peer;
  d["host"] = l.host;
  d["pid"] = l.pid;
  d["transport"] = l.transport;
  d["local_address"] = l.local_address;
  d["remote_address"] = l.remote_address;
  d["bytes_sent"] = l.bytes_sent;
  d["bytes_recv"] = l.bytes_recv;
  d["frames_sent"] = l.frames_sent;
  d["frames_recv"] = l.frames_recv;
  d["busy_ns"] = l.busy_ns;
  d["last_activity_ns"] = l.last_activity_ns;
  d["reconnects"] = l.reconnects;
  d["single_copy_bytes"] = l.single_copy_bytes;
  d["push_bytes"] = l.push_bytes;
  d["sends_unacked_max"] = l.sends_unacked_max;
  py::dict prog;
  prog["send_posted"] = l.send_posted;
  prog["send_sent"] = l.send_sent;
  prog["send_acked"] = l.send_acked;
  prog["send_done"] = l.send_done;
  prog["recv_posted"] = l.recv_posted;
  prog["recv_received"] = l.recv_received;
  prog["recv_done"] = l.recv_done;
  prog["last_change_ns"] = l.progress_change_ns;
  d["progress"] = prog;
  if (l.health.samples) {
    const LinkHealthSnapshot& h = l.health;
    py::dict t;
    t["rtt_us"] = h.rtt_us;
    t["rttvar_us"] = h.rttvar_us;
    t["retransmits_total"] = h.retransmits_total;
    t["retransmitting"] = h.retransmitting;
    t["unacked"] = h.unacked;
    t["lost"] = h.lost;
    t["delivery_rate_bps"] = h.delivery_rate_bps;
    t["bytes_acked"] = h.bytes_acked;
    t["bytes_received"] = h.bytes_received;
    t["ms_since_data_sent"] = h.ms_since_data_sent;
    t["ms_since_data_recv"] = h.ms_since_data_recv;
    t["ms_since_ack_recv"] = h.ms_since_ack_recv;
    t["rate_app_limited"] = h.rate_app_limited;
    t["sampled_ns"] = h.sampled_ns;
    d["tcp"] = t;
  } else {
    d["tcp"] = py::none();
  }
  return d;
}

// The C table behind ExternalComm._hooks(): how hetobs._torch_ext (built against torch)
// records into this module's ExternalComm. A reference is a heap shared_ptr.
using ExternalRef = std::shared_ptr<ExternalComm>;

uint64_t hookBegin(void* c, const ExternalOp* op) {
  try {
    return (*static_cast<ExternalRef*>(c))->begin(*op);
  } catch (const std::exception& e) {  // telemetry never raises into the job
    HETOBS_WARN("recording a vendor op failed: %s", e.what());
    return 0;
  }
}

void hookEnd(void* c, uint64_t token, bool ok, const char* error) {
  try {
    (*static_cast<ExternalRef*>(c))->end(token, ok, error);
  } catch (const std::exception& e) {
    HETOBS_WARN("recording the end of a vendor op failed: %s", e.what());
  }
}

void* hookRetain(void* c) { return new ExternalRef(*static_cast<ExternalRef*>(c)); }
void hookRelease(void* c) { delete static_cast<ExternalRef*>(c); }

bool hookDigestDue(void* c, uint64_t token) {
  try {
    return (*static_cast<ExternalRef*>(c))->digestDue(token);
  } catch (const std::exception& e) {
    HETOBS_WARN("deciding on a result digest failed: %s", e.what());
    return false;
  }
}

void copyMessage(const std::string& text, char* msg, uint64_t cap) {
  if (!msg || cap == 0) return;
  size_t n = std::min<size_t>(text.size(), size_t(cap - 1));
  memcpy(msg, text.data(), n);
  msg[n] = '\0';
}

int hookCheckResult(void* c, uint64_t token, uint8_t* data, uint64_t count, uint32_t es,
                    int (*gather)(void*, const uint8_t*, uint64_t, uint8_t*), void* ctx, char* msg, uint64_t cap) {
  try {
    auto exchange = [gather, ctx](const uint8_t* mine, size_t bytes, uint8_t* all) {
      if (gather(ctx, mine, bytes, all) != 0) throw Error("the library's all_gather of result digests failed");
    };
    std::string text;
    int rc = (*static_cast<ExternalRef*>(c))->checkResult(token, data, size_t(count), es, exchange, &text);
    copyMessage(text, msg, cap);
    return rc;
  } catch (const std::exception& e) {  // never raised through the C table: the op stands, unchecked
    HETOBS_WARN("checking the result digest of a vendor op failed: %s", e.what());
    copyMessage(std::string("checking the result digest failed: ") + e.what(), msg, cap);
    return -1;
  }
}

const ExternalHooks kHooks{kExternalHooksAbi, hookBegin,     hookEnd,        hookRetain,
                           hookRelease,       hookDigestDue, hookCheckResult};

void checkIsland(const std::string& island, Backend backend) {
  if (island.size() >= kIslandNameBytes)
    throw py::value_error("ExternalComm: island name '" + island + "' is longer than " +
                          std::to_string(kIslandNameBytes - 1) + " bytes");
  if (backend == Backend::kIslands && island.empty())
    throw py::value_error("ExternalComm: a backend 'islands' communicator needs its rank's island name (island=...)");
}

int64_t phaseValue(const std::string& key, py::handle v) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw py::type_error("end: phases['" + key + "'] must be an int, not " +
                         std::string(py::str(v.get_type().attr("__name__"))));
  int64_t n = v.cast<int64_t>();
  if (n < 0) throw py::value_error("end: phases['" + key + "'] = " + std::to_string(n) + " is negative");
  return n;
}

// {"vendor_ns", "d2h_ns", "wire_ns", "h2d_ns", "chunks"} -> IslandPhases (missing keys: 0); any other key is a
// caller's mistake, named in the error.
IslandPhases phasesFrom(const py::object& obj) {
  struct Time {
    const char* key;
    int64_t IslandPhases::*field;
  };
  static const Time kTimes[] = {{"vendor_ns", &IslandPhases::vendor_ns}, {"d2h_ns", &IslandPhases::d2h_ns},
                                {"wire_ns", &IslandPhases::wire_ns}, {"h2d_ns", &IslandPhases::h2d_ns}};
  if (!py::isinstance<py::dict>(obj)) throw py::type_error("end: phases must be a dict or None");
  IslandPhases ph{};
  for (auto item : obj.cast<py::dict>()) {
    std::string k = py::str(item.first);
    if (k == "chunks") {
      int64_t v = phaseValue(k, item.second);
      if (v > int64_t(UINT32_MAX)) throw py::value_error("end: phases['chunks'] = " + std::to_string(v) + " too large");
      ph.chunks = uint32_t(v);
      continue;
    }
    const Time* t = nullptr;
    for (const Time& c : kTimes)
      if (k == c.key) t = &c;
    if (!t) throw py::value_error("end: phases key '" + k + "': expected vendor_ns, d2h_ns, wire_ns, h2d_ns or chunks");
    ph.*(t->field) = phaseValue(k, item.second);
  }
  return ph;
}


}  // namespace

void registerComm(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &Work::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("is_completed", &Work::isCompleted);

  py::class_<RelayWork>(m, "RelayWork")
      .def("wait", [](RelayWork& w, double timeout) { return w.work->wait(timeout); }, py::arg("timeout") = -1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("is_completed", [](RelayWork& w) { return w.work->isCompleted(); })
      .def("phases", [](RelayWork& w) {
        if (!w.work->isCompleted()) throw py::value_error("the relay has not finished: wait() for it first");
        return phasesDict(w.request->phases);
      });

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("comm_id", &Communicator::id)
      .def_property_readonly("global_ranks", &Communicator::worldRanks)
      .def_property_readonly("address",
                             [](const Communicator& c) {
                               return py::make_tuple(c.endpoint().card().ip, c.endpoint().card().port);
                             })
      .def(
          "run",
          [](Communicator& c, int op, uintptr_t sptr, size_t scount, uintptr_t rptr, size_t rcount, int dtype,
             int redop, int root, double timeout, bool async) -> py::object {
            OpArgs a = makeArgs(op, sptr, scount, rptr, rcount, dtype, redop, root, timeout, c.size());
            std::shared_ptr<Work> w;
            {
              py::gil_scoped_release nogil;
              w = c.submit(a, async);
            }
            if (!w) return py::none();
            return py::cast(w);
          },
          py::arg("op"), py::arg("send_ptr"), py::arg("send_count"), py::arg("recv_ptr"), py::arg("recv_count"),
          py::arg("dtype"), py::arg("redop"), py::arg("root"), py::arg("timeout"), py::arg("async_op"))
      .def(
          "all_reduce_inplace",
          [](Communicator& c, py::handle x, int redop) -> bool {
            OpArgs a;
            if (!fastAllReduceArgs(x.ptr(), redop, &a)) return false;
            ReleaseGil nogil;  // the caller's reference keeps the array (and its memory) alive meanwhile
            c.submit(a, false);
            return true;
          },
          py::arg("x"), py::arg("redop"),
          "Blocking in-place all_reduce of a writable C-contiguous numpy array; false (nothing run) when "
          "the array needs the general path.")
      .def(
          "fast_entry",
          [](std::shared_ptr<Communicator> c, const std::string& op) { return fastEntry(std::move(c), op); },
          py::arg("op"),
          "`op`'s fast path bound to this communicator as a plain C function (a small op's entry from "
          "Python without pybind11's per-call dispatch): all_reduce(x, redop), all_gather(out, x), "
          "reduce_scatter(out, x, redop), broadcast(x, root). Each returns True when it ran the op, False "
          "(nothing run) when its arguments need the general path.")
      .def(
          "fast_front",
          [](std::shared_ptr<Communicator> c, const std::string& op, py::object method, py::object owner) {
            return fastFront(std::move(c), op, std::move(method), std::move(owner));
          },
          py::arg("op"), py::arg("method"), py::arg("owner"),
          "The public method `op` of `owner` (a hetobs.Communicator) as a C function: its commonest call "
          "(numpy arrays, default reduction or a root, no keywords) runs in C; any other calls "
          "method(owner, ...). `owner` is held weakly.")
      .def(
          "run_loop",
          // The same op `iters` times back to back without returning to Python (GIL released
          // once): what a collective costs natively, beside the Python loop over run(), so a
          // benchmark can tell the binding's and the interpreter's share from the transport's.
          [](Communicator& c, int op, uintptr_t sptr, size_t scount, uintptr_t rptr, size_t rcount, int dtype,
             int redop, int root, double timeout, int64_t iters) -> int64_t {
            OpArgs a = makeArgs(op, sptr, scount, rptr, rcount, dtype, redop, root, timeout, c.size());
            if (iters < 1) throw py::value_error("iters must be at least 1, got " + std::to_string(iters));
            py::gil_scoped_release nogil;
            int64_t t0 = monoNs();
            for (int64_t i = 0; i < iters; ++i) c.submit(a, false);
            return monoNs() - t0;
          },
          py::arg("op"), py::arg("send_ptr"), py::arg("send_count"), py::arg("recv_ptr"), py::arg("recv_count"),
          py::arg("dtype"), py::arg("redop"), py::arg("root"), py::arg("timeout"), py::arg("iters"),
          "Run one op `iters` times natively; returns the total nanoseconds.")
      .def(
          "relay",
          [](Communicator& c, const MessageList& sends, const MessageList& recvs, int stage, bool pipeline,
             size_t chunk, size_t slots, double timeout, bool async, int device, uintptr_t cudaStream,
             int deviceType, py::object deviceStream) -> py::object {
            auto req = makeRelay(c, sends, recvs, stage, pipeline, chunk, slots, device, cudaStream, deviceType,
                                 std::move(deviceStream));
            OpArgs a;
            a.op = OpKind::kRelay;
            a.dtype = DType::kUint8;
            for (const auto& m : req->sends) a.send_count += m.bytes;
            for (const auto& m : req->recvs) a.recv_count += m.bytes;
            a.timeout_s = timeout;
            a.relay = req;
            std::shared_ptr<Work> w;
            {
              py::gil_scoped_release nogil;
              w = c.submit(a, async);
            }
            if (!w) return phasesDict(req->phases);
            return py::cast(RelayWork{w, req});
          },
          py::arg("sends"), py::arg("recvs"), py::arg("stage"), py::arg("pipeline"), py::arg("chunk_bytes"),
          py::arg("slots"), py::arg("timeout"), py::arg("async_op"), py::arg("device") = -1,
          py::arg("cuda_stream") = 0, py::arg("device_type") = -1, py::arg("device_stream") = py::none())
      .def(
          "split",
          [](Communicator& c, int color, int key) {
            py::gil_scoped_release nogil;
            return c.split(color, key);
          },
          py::arg("color"), py::arg("key"))
      .def("wait_policy",
           [](Communicator& c) {
             py::dict d;
             d["oversubscribed"] = c.oversubscribed();
             return d;
           })
      .def("links",
           [](const Communicator& c) {
             py::list out;
             for (const auto& l : c.links()) out.append(linkDict(l));
             return out;
           })
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>());

  py::class_<Endpoint, std::shared_ptr<Endpoint>>(m, "Endpoint")
      .def(py::init([](int rank, int size, const std::string& job, const std::string& secret,
                       const std::string& transport, double timeout, double connectTimeout, size_t smallBytes,
                       const std::string& dir, double hangTimeout, bool abortOnHang, int dumpSignal,
                       uint32_t records, bool watchdog, const std::string& bwLog, double bwLogInterval,
                       const std::string& bwLogFile, bool jobIdGenerated) {
             CommConfig cfg;
             cfg.rank = rank;
             cfg.size = size;
             cfg.job_id = job;
             cfg.job_id_generated = jobIdGenerated;
             cfg.secret = secret;
             cfg.transport = parseTransport(transport);
             cfg.timeout_s = timeout;
             cfg.connect_timeout_s = connectTimeout;
             cfg.small_bytes = smallBytes;
             cfg.observe.dir = dir;
             cfg.observe.hang_timeout_s = hangTimeout;
             cfg.observe.abort_on_hang = abortOnHang;
             cfg.observe.dump_signal = dumpSignal;
             cfg.observe.records = records;
             cfg.watchdog = watchdog;
             cfg.observe.bw_log = bwLog;
             cfg.observe.bw_log_interval_s = bwLogInterval;
             cfg.observe.bw_log_file = bwLogFile;
             return std::make_shared<Endpoint>(cfg);
           }),
           py::arg("rank"), py::arg("size"), py::arg("job_id"), py::arg("secret"), py::arg("transport"),
           py::arg("timeout"), py::arg("connect_timeout"), py::arg("small_bytes"), py::arg("dir"),
           py::arg("hang_timeout"), py::arg("abort_on_hang"), py::arg("dump_signal"), py::arg("records"), py::arg("watchdog") = true,
           py::arg("bw_log") = "off", py::arg("bw_log_interval") = 15.0, py::arg("bw_log_file") = "",
           py::arg("job_id_generated") = false)
      .def_property_readonly("job_id", &Endpoint::jobId)
      .def("adopt_job_id", &Endpoint::adoptJobId, py::arg("job_id"), py::call_guard<py::gil_scoped_release>(),
           "Take the job id rank 0 handed out and start this rank's runtime under it.")
      .def("card", [](const Endpoint& e) { return py::bytes(e.card().encode()); })
      .def("advertise_toward", &Endpoint::advertiseToward, py::arg("host"),
           "Put the local address toward `host` in this rank's card (before card() for a store rendezvous).")
      .def_property_readonly("address", [](const Endpoint& e) { return py::make_tuple(e.card().ip, e.card().port); })
      .def("refused_connections", [](Endpoint& e) { return e.listener().refused(); })
      .def(
          "connect",
          [](Endpoint& e, const std::vector<std::string>& cards, uint64_t commId, std::vector<int> worldRanks) {
            py::gil_scoped_release nogil;
            return e.connect(cards, commId, std::move(worldRanks));
          },
          py::arg("cards"), py::arg("comm_id") = 0, py::arg("world_ranks") = std::vector<int>{})
      .def(
          "rendezvous",
          [](Endpoint& e, const std::string& addr, int port) {
            py::gil_scoped_release nogil;
            return e.rendezvous(addr, port);
          },
          py::arg("master_addr"), py::arg("master_port"));

  m.def(
      "probe",
      [](const std::string& host, int port, const std::string& job, const std::string& secret, double timeout) {
        py::gil_scoped_release nogil;
        probe(host, port, job, secret, timeout);
      },
      py::arg("host"), py::arg("port"), py::arg("job_id"), py::arg("secret"), py::arg("timeout") = 2.0,
      "Authenticate to a rank's listener; raises hetobs.AuthError when refused.");

  py::class_<ExternalComm, std::shared_ptr<ExternalComm>>(m, "ExternalComm",
                                                          "Records ops that a vendor library runs (Gloo, NCCL, MPI).")
      .def(py::init([](uint64_t id, std::vector<int> global, int rank, int backend, int device, std::string name,
                       std::string island, std::string deviceName, std::string library) {
             if (backend < 0 || backend > int(Backend::kVendor)) throw py::value_error("invalid backend code");
             if (device < 0 || device > int(DeviceType::kOther)) throw py::value_error("invalid device code");
             if (deviceName.size() >= kDeviceNameBytes || library.size() >= kLibraryNameBytes)
               throw py::value_error("ExternalComm: device_name and library are at most " +
                                     std::to_string(kDeviceNameBytes - 1) + " bytes");
             if (rank < 0 || rank >= int(global.size())) throw py::value_error("rank outside the member list");
             checkIsland(island, Backend(backend));
             auto c = std::make_shared<ExternalComm>(id, std::move(global), rank, Backend(backend),
                                                     DeviceType(device), std::move(name), std::move(island),
                                                     std::move(deviceName), std::move(library));
             c->attach();
             return c;
           }),
           py::arg("comm_id"), py::arg("global_ranks"), py::arg("rank"), py::arg("backend"), py::arg("device"),
           py::arg("name") = "", py::arg("island") = "", py::arg("device_name") = "", py::arg("library") = "")
      .def(
          "begin",
          [](ExternalComm& c, int op, int dtype, int redop, int rootOrPeer, uint64_t count, uint64_t outCount,
             uint64_t bytes) {
            if (op < 0 || op >= int(OpKind::kCount)) throw py::value_error("invalid op code");
            ExternalOp o;
            o.op = OpKind(op);
            o.dtype = DType(dtype >= 0 && dtype < int(DType::kCount) ? dtype : 0);
            o.redop = RedOp(redop >= 0 && redop < int(RedOp::kCount) ? redop : 0);
            o.root_or_peer = rootOrPeer;
            o.count = count;
            o.out_count = outCount;
            o.bytes = bytes;
            return c.begin(o);
          },
          py::arg("op"), py::arg("dtype"), py::arg("redop"), py::arg("root_or_peer"), py::arg("count"),
          py::arg("out_count"), py::arg("bytes"))
      .def(
          "end",
          [](ExternalComm& c, uint64_t token, bool ok, const py::object& error, int64_t start, int64_t end,
             const py::object& phases) {
            std::string err = error.is_none() ? "" : py::str(error).cast<std::string>();
            const char* e = err.empty() ? nullptr : err.c_str();
            if (phases.is_none()) return c.end(token, ok, e, start, end);
            IslandPhases ph;
            try {
              ph = phasesFrom(phases);
            } catch (...) {
              c.end(token, ok, e, start, end);  // the op still ends (no false hang); the caller learns why
              throw;
            }
            c.end(token, ok, e, start, end, &ph);
          },
          py::arg("token"), py::arg("ok") = true, py::arg("error") = py::none(), py::arg("start") = 0,
          py::arg("end") = 0, py::arg("phases") = py::none(),
          "Finish op `token`. start/end: monotonic ns (time.monotonic_ns()) when it really ran, 0 = begin()/now; "
          "phases: {'vendor_ns', 'd2h_ns', 'wire_ns', 'h2d_ns', 'chunks'} of a hierarchical op (missing keys: 0).")
      .def(
          "set_phase",
          [](ExternalComm& c, uint64_t token, const std::string& phase) {
            IslandPhase p;
            if (!islandPhaseFromName(phase.c_str(), &p))
              throw py::value_error("set_phase: phase '" + phase + "': expected none, vendor, relay, d2h, wire or h2d");
            c.setPhase(token, p);
          },
          py::arg("token"), py::arg("phase"),
          "The in-flight op `token` now runs `phase` (shown as the in-flight op's \"phase\" in dumps).")
      .def_property_readonly("island", [](const ExternalComm& c) { return std::string(c.island()); })
      .def(
          "_hooks",
          [](const std::shared_ptr<ExternalComm>& self) {
            auto* handle = new ExternalHandle{&kHooks, new ExternalRef(self)};
            return py::capsule(handle, kExternalHooksCapsule, [](PyObject* cap) {
              auto* h = static_cast<ExternalHandle*>(PyCapsule_GetPointer(cap, kExternalHooksCapsule));
              h->hooks->release(h->comm);
              delete h;
            });
          },
          "A capsule through which hetobs._torch_ext records into this communicator.")
      .def_property_readonly("comm_id", &ExternalComm::id)
      .def_property_readonly("rank", &ExternalComm::rank)
      .def_property_readonly("size", &ExternalComm::size);

  m.def(
      "set_device_lane_hooks",
      [](py::capsule hooks) {
        if (std::string(hooks.name() ? hooks.name() : "") != kDeviceLaneHooksCapsule)
          throw py::type_error("set_device_lane_hooks: expected hetobs._torch_ext.device_lane_hooks()");
        auto* h = hooks.get_pointer<DeviceLaneHooks>();
        if (h->abi != kDeviceLaneHooksAbi)
          throw py::type_error("set_device_lane_hooks: hetobs._core and hetobs._torch_ext were built from different "
                               "sources");
        setDeviceLaneHooks(h);  // the table is static in hetobs._torch_ext, which is never unloaded
      },
      py::arg("hooks"), "Let the relay copy to and from any torch device (stage 'device').");
  m.def("device_lane_hooks_set", []() { return deviceLaneHooks() != nullptr; });
  m.def(
      "relay_copy_bench",
      [](uintptr_t addr, size_t nbytes, size_t chunk, size_t slots, int deviceType, int deviceIndex, bool toDevice) {
        // One copy stage alone, as the pipeline runs it: chunk-sized copies on one lane into (or
        // out of) a ring of `slots` staging slots. deviceType < 0: host memcpy on a copy thread
        // from `addr`; else the device lane of (deviceType, deviceIndex), device -> staging, or
        // staging -> device (toDevice) at `addr`. Returns the nanoseconds it took.
        if (chunk < 1 || slots < 1) throw py::value_error("chunk and slots must be at least 1");
        py::gil_scoped_release nogil;
        // One lane and staging per kind for the process, made on the first call (as a
        // communicator's are on its first relay), so a timing holds no thread start or page faults.
        struct Bench {
          std::unique_ptr<CopyLane> lane;
          uint8_t* staging = nullptr;
          size_t stagingBytes = 0;
        };
        static std::mutex mu;
        static std::map<std::tuple<int, int, bool>, Bench> benches;
        std::lock_guard<std::mutex> lk(mu);
        Bench& b = benches[{deviceType, deviceIndex, toDevice}];
        if (!b.lane)
          b.lane = deviceType < 0 ? makeHostCopyLane(nullptr)
                                  : makeDeviceCopyLane(deviceType, deviceIndex, toDevice, nullptr);
        if (b.stagingBytes < chunk * slots) {
          if (b.staging) b.lane->freeStaging(b.staging);
          b.staging = b.lane->allocStaging(chunk * slots);
          b.stagingBytes = chunk * slots;
        }
        uint8_t* p = reinterpret_cast<uint8_t*>(addr);
        int64_t t0 = monoNs();
        uint64_t last = b.lane->completed();
        size_t i = 0;
        for (size_t off = 0; off < nbytes; off += chunk, ++i) {
          uint8_t* slot = b.staging + (i % slots) * chunk;
          size_t n = std::min(chunk, nbytes - off);
          last = toDevice ? b.lane->post(p + off, slot, n) : b.lane->post(slot, p + off, n);
        }
        while (b.lane->completed() < last) b.lane->waitFor(last, 1000000000);
        return monoNs() - t0;
      },
      py::arg("addr"), py::arg("nbytes"), py::arg("chunk_bytes"), py::arg("slots"), py::arg("device_type") = -1,
      py::arg("device_index") = -1, py::arg("to_device") = false);
  m.def(
      "buffer_address",
      [](py::handle obj) {
        // The address behind a contiguous buffer (numpy array), via the buffer protocol:
        // ~10x cheaper than numpy's .ctypes.data on the per-op path.
        Py_buffer view;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS) != 0) throw py::error_already_set();
        uintptr_t addr = reinterpret_cast<uintptr_t>(view.buf);
        PyBuffer_Release(&view);
        return addr;
      },
      "Address of a contiguous buffer's first byte.");
  m.def(
      "side_channel_request",
      [](const std::string& ip, int port, const std::string& job, const std::string& secret, const std::string& request,
         double timeout) {
        py::gil_scoped_release nogil;
        return sideChannelRequest(ip, port, job, secret, request, timeout);
      },
      py::arg("ip"), py::arg("port"), py::arg("job_id"), py::arg("secret"), py::arg("request"),
      py::arg("timeout") = 2.0, "Send one request to a rank's side channel and return its reply.");
  m.def(
      "simulate_dump_spread",
      [](int n, const std::vector<int>& dead, int origin, int fanout) {
        if (n <= 0 || origin < 0 || origin >= n) throw py::value_error("need 0 <= origin < n");
        std::vector<uint8_t> isDead(size_t(n), 0);
        for (int r : dead) {
          if (r < 0 || r >= n) throw py::value_error("dead rank out of range");
          isDead[size_t(r)] = 1;
        }
        py::gil_scoped_release nogil;
        SpreadSimulation s = simulateSpread(n, isDead, origin, fanout);
        py::gil_scoped_acquire gil;
        py::dict d;
        d["messages"] = s.messages;
        d["rounds"] = s.rounds;
        d["reached"] = s.reached;
        d["duplicates"] = s.duplicates;
        return d;
      },
      py::arg("n"), py::arg("dead"), py::arg("origin") = 0, py::arg("fanout") = int(kSpreadFanout),
      "Job-wide dump spread over n ranks without a network (the runtime's chunking and take-over).");
  m.def(
      "dump_spread_chunks",
      [](int lo, int hi, int fanout) {
        std::vector<std::pair<int, int>> out;
        for (SpreadInterval c : spreadChunks(SpreadInterval{lo, hi}, fanout)) out.emplace_back(c.lo, c.hi);
        return out;
      },
      py::arg("lo"), py::arg("hi"), py::arg("fanout") = int(kSpreadFanout),
      "The chunks the head of [lo, hi) hands a dump request on to.");
  m.def(
      "set_stack_dumper", [](int signal, int fd) {
        Runtime* rt = Runtime::get();
        if (rt) rt->setStackDumper(signal, fd);
      },
      "Dumps collect Python stacks by raising `signal` (faulthandler writes them into `fd`).");
  m.def(
      "mark_exit",
      [](bool clean) {
        py::gil_scoped_release nogil;
        if (Runtime* rt = Runtime::get()) rt->markExit(clean);
      },
      py::arg("clean"));
  m.def("runtime_info", []() -> py::object {
    Runtime* rt = Runtime::get();
    if (!rt) return py::none();
    py::dict d;
    d["job"] = rt->config().job;
    d["job_dir"] = rt->jobDir().path();
    d["stats_segment"] = rt->stats().path();
    d["control_socket"] = rt->controlSocketPath();
    d["rank"] = rt->config().rank;
    return d;
  });
  m.def(
      "dump_now",
      [](const std::string& reason, const std::string& cause, bool askPeers) -> std::string {
        Runtime* rt = Runtime::get();
        if (!rt) throw py::value_error("hetobs.init() has not run in this process");
        py::gil_scoped_release nogil;
        DumpRequest req;
        req.incident = "ondemand-" + std::to_string(wallNs() / 1000000) + "-r" + std::to_string(rt->config().rank);
        req.reason = reason;
        req.cause = cause;
        req.ask_peers = askPeers;
        return rt->dump(req);
      },
      py::arg("reason") = "on_demand", py::arg("cause") = "requested from Python", py::arg("ask_peers") = false);
  m.def(
      "settings_table",
      [] {
        // As this build compiled it (generated from hetobs/settings_table.py): a stale build shows here.
        py::list out;
        for (size_t i = 0; i < kSettingCount; ++i) {
          const SettingSpec& s = kSettings[i];
          py::list choices;
          for (const char* c = s.choices; *c;) {
            const char* end = strchr(c, ',');
            std::string choice = end ? std::string(c, size_t(end - c)) : std::string(c);
            choices.append(choice);
            c = end ? end + 1 : c + choice.size();
          }
          out.append(py::make_tuple(s.name, settingKindName(s.kind), s.dflt, s.minimum, s.maximum,
                                    py::tuple(choices)));
        }
        return out;
      },
      "The native settings table: (name, kind, default, minimum, maximum, choices) per row, in order.");
  m.def(
      "native_setting",
      [](const std::string& name) {
        // What the native parser reads for one setting from this process's environment, for tests
        // that hold its errors and values next to hetobs.config's.
        std::string value, error;
        if (!readSetting(name.c_str(), &value, &error)) throw py::value_error(error);
        return value;
      },
      py::arg("name"), "The native parser's value of a setting as text; ValueError naming a bad value.");
  m.def(
      "advertised_address", [] { return advertisedAddressFromEnv(); }, py::call_guard<py::gil_scoped_release>(),
      "The address the MPI and NCCL interposers' side channels bind and advertise, from this environment.");
  m.def(
      "native_job_id",
      [] {
        EnvSettings s;
        std::string error;
        if (!readEnvSettings(&s, &error)) throw py::value_error(error);
        return py::make_tuple(s.job_id, s.job_id_generated);
      },
      "The job id the interposers read from this process's environment: (id, generated).");
  m.def("set_log_level", [](const std::string& level) {
    static const char* kNames[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    for (int i = 0; i < 4; ++i)
      if (level == kNames[i]) return setLogLevel(LogLevel(i));
    throw py::value_error("log level '" + level + "': expected ERROR, WARN, INFO or DEBUG");
  });
}

}  // namespace bindings
}  // namespace hetobs
