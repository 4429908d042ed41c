// MpiWorld for builds without MPI: create() says how to get it.
#include "runtime/comm/mpi_world.h"

namespace strata::runtime {

bool mpi_built() { return false; }

class MpiWorld::Impl {};

MpiWorld::MpiWorld(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiWorld::~MpiWorld() = default;

Result<std::shared_ptr<MpiWorld>> MpiWorld::create(int, const MpiWorldOptions &) {
  return unimplemented("this strata was built without MPI; install Open MPI (scripts/setup) and "
                       "rebuild to run a plan over several processes");
}

int MpiWorld::num_devices() const { return 0; }
bool MpiWorld::is_local(int) const { return false; }
std::chrono::milliseconds MpiWorld::timeout() const { return {}; }
Status MpiWorld::run(const std::function<Status(int, Communicator &)> &) {
  return unimplemented("built without MPI");
}
Status MpiWorld::run_with_side(const std::function<Status(int, Communicator &, Communicator *)> &) {
  return unimplemented("built without MPI");
}
void MpiWorld::report(int, int64_t, int64_t) {}
int MpiWorld::rank() const { return 0; }
std::span<std::byte> MpiWorld::shared_memory(int) const { return {}; }
int MpiWorld::size() const { return 1; }
Status MpiWorld::gather(const std::string &, std::vector<std::string> *, std::string_view) {
  return unimplemented("built without MPI");
}
Status MpiWorld::broadcast(std::string *, std::string_view) {
  return unimplemented("built without MPI");
}
void MpiWorld::set_describer(std::function<std::string(int, int64_t)>) {}
void MpiWorld::set_label(int, std::string) {}
void MpiWorld::fail(const Status &) {}
Status MpiWorld::failure() const { return Status::ok(); }
void MpiWorld::finish(bool) {}
Status MpiWorld::agree(const std::string &, const std::string &,
                       const std::vector<std::pair<std::string, std::string>> &) {
  return Status::ok();
}

} // namespace strata::runtime
