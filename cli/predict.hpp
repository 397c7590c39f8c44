#pragma once
// `--predict` for training commands (issue #6): after training, the simulator's prediction for the same job on
// a cluster description, printed beside what the run measured, with the relative errors. Implemented in
// cmd_calibrate.cpp on the C ABI (tandem_trainer_predict). A training command adds the options with
// add_predict_options() and, at the end, calls print_prediction() on rank 0.
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "tandem/tandem.h"

namespace tandem::cli {

struct PredictOptions {
  bool enabled = false;
  std::string cluster;   // --predict-cluster; default $TANDEM_PREDICT_CLUSTER, else this machine (see .cpp)
  std::string profile;   // --profile; default $TANDEM_PROFILE, else the roofline
  bool profile_network = false;
};

void add_predict_options(CLI::App& app, PredictOptions& o);

// Prints the comparison (a table, or one JSON line {"prediction": ...} when json) to stdout. For a
// single-process trainer pass its measured step time and step count (a parallel trainer keeps its own split;
// pass 0, 0). Returns 0, or 1 after printing the error.
int print_prediction(tandem_trainer_t* trainer, const PredictOptions& o, bool json, double single_step_s = 0,
                     int64_t single_steps = 0);

}  // namespace tandem::cli
