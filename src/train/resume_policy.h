// What a run resumed from a checkpoint may change, setting by setting (as torchtitan and
// Lightning decide it): the run's length may grow; the layout (dp, tp, pp, ZeRO, the
// micro-batch and accumulation: resharding is reading), evaluation, the device's settings
// and the checkpoint cadence may change; the model, the data, the optimizer's
// hyperparameters, the schedule, the seed and the precision may not, unless the user names
// them in --resume-change; the optimizer itself and the global batch never (its state, and
// the data position, would not carry over).
//
// Settings are the fields of the configuration fingerprint every rank agrees on
// (train/agree.h), plus the global batch, as a record "key" -> "value"; a checkpoint's
// manifest holds its run's (train/checkpoint.h).
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "train/config.h"

namespace sat {

using Settings = std::map<std::string, std::string>;

// The "key=value;" fields of a configuration fingerprint as a record.
Settings settings_of(const std::string& fingerprint);

// --resume-change's list: setting names separated by commas ('-' or '_' alike), each one a
// resumed run may change when named. sat::Error naming the flag and the names it takes.
std::set<std::string> parse_resume_change(const std::string& list);

// The checkpoint's settings (`was`; `where` names the checkpoint) against this run's
// (`now`): every setting that differs, when each may (`allowed`: --resume-change's names).
// sat::Error on the first that may not, naming the setting and both values, and the flag
// that would allow it.
std::vector<SettingChange> resume_changes(const Settings& was, const Settings& now, const std::set<std::string>& allowed,
                                          const std::string& where);

}  // namespace sat
