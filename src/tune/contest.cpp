#include "tune/contest.h"

#include <algorithm>
#include <cmath>

namespace sat {

namespace {

// The q-quantile of sorted values, interpolated between neighbours.
double quantile(const std::vector<double>& v, double q) {
  const double at = q * double(v.size() - 1);
  const size_t k = size_t(at);
  return k + 1 < v.size() ? v[k] + (at - double(k)) * (v[k + 1] - v[k]) : v[k];
}

// The centre of per-round values and its standard error: the mean of one or two rounds,
// the median of three or more (a round that a burst of other work hit is an outlier, not
// a shift). The standard error is the larger of what the per-round errors say (within)
// and what the rounds' scatter says (between: the standard deviation, or from three on
// the median absolute deviation scaled to one).
struct Centre {
  double value = 0, se = 0;
};
Centre centre(std::vector<double> v, double sum_sq_se) {
  const double n = double(v.size());
  Centre c;
  c.se = std::sqrt(sum_sq_se) / n;
  if (v.size() <= 2) {
    for (double x : v) c.value += x / n;
    if (v.size() == 2) c.se = std::max(c.se, std::fabs(v[0] - v[1]) / 2);  // sd / sqrt(2)
    return c;
  }
  std::sort(v.begin(), v.end());
  c.value = quantile(v, 0.5);
  std::vector<double> dev;
  for (double x : v) dev.push_back(std::fabs(x - c.value));
  std::sort(dev.begin(), dev.end());
  c.se = std::max(c.se, 1.2533 * 1.4826 * quantile(dev, 0.5) / std::sqrt(n));
  return c;
}

Ratio compare_offset(const Contender& a, const Contender& b) {
  Ratio r = compare(a.timings, b.timings);
  r.log += a.log_offset - b.log_offset;
  return r;
}

}  // namespace

ProbeTiming time_probe(std::vector<double> s, double samples_per_step, int round) {
  ProbeTiming t;
  t.round = round;
  t.steps = int(s.size());
  if (s.empty()) return t;
  std::sort(s.begin(), s.end());
  const double median = quantile(s, 0.5);
  if (!(median > 0)) return t;
  t.samples_per_second = samples_per_step / median;
  const double n = double(s.size());
  const double spread = s.size() >= 4 ? quantile(s, 0.75) - quantile(s, 0.25) : s.back() - s.front();
  t.iqr_fraction = spread / median;
  // sigma from the IQR, or from the range over d2(n) for 2 or 3 steps; the median's
  // standard error is 1.2533 sigma / sqrt(n). One step says nothing about its noise: 10%,
  // as if the machine were busy.
  const double sigma = s.size() >= 4 ? spread / 1.349 : spread / (s.size() == 2 ? 1.128 : 1.693);
  t.log_se = s.size() >= 2 ? 1.2533 * sigma / median / std::sqrt(n) : 0.1;
  return t;
}

double Ratio::low(double z) const { return std::exp(log - z * se); }
double Ratio::high(double z) const { return std::exp(log + z * se); }
double Ratio::value() const { return std::exp(log); }

Ratio compare(const std::vector<ProbeTiming>& a, const std::vector<ProbeTiming>& b) {
  std::vector<double> d;
  double sum_sq_se = 0;
  for (const ProbeTiming& x : a)
    for (const ProbeTiming& y : b)
      if (x.round == y.round && x.samples_per_second > 0 && y.samples_per_second > 0) {
        d.push_back(std::log(x.samples_per_second / y.samples_per_second));
        sum_sq_se += x.log_se * x.log_se + y.log_se * y.log_se;
      }
  Ratio r;
  r.rounds = int(d.size());
  if (d.empty()) return r;
  const Centre m = centre(d, sum_sq_se);
  r.log = m.value;
  r.se = m.se;
  return r;
}

Estimate estimate(const Contender& c) {
  std::vector<double> v;
  double sum_sq_se = 0;
  for (const ProbeTiming& t : c.timings)
    if (t.samples_per_second > 0) v.push_back(std::log(t.samples_per_second)), sum_sq_se += t.log_se * t.log_se;
  if (v.empty()) return {-INFINITY, INFINITY};
  const Centre m = centre(v, sum_sq_se);
  return {m.value + c.log_offset, m.se};
}

std::vector<int> entrants(const std::vector<Contender>& c, const ContestRules& rules) {
  int leader = -1;
  for (int i = 0; i < int(c.size()); ++i)
    if (estimate(c[size_t(i)]).log > (leader < 0 ? -INFINITY : estimate(c[size_t(leader)]).log)) leader = i;
  std::vector<int> in;
  if (leader < 0) return in;
  const double reach = 1 - rules.entry * rules.knee;
  for (int i = 0; i < int(c.size()); ++i) {
    const Ratio r = compare_offset(c[size_t(i)], c[size_t(leader)]);
    // A larger micro-batch measured slower than the leader may have met a busy moment.
    const bool larger = c[size_t(i)].micro_batch > c[size_t(leader)].micro_batch;
    if (i == leader || (r.rounds > 0 && (larger || reach <= 0 || r.high(rules.z) >= reach))) in.push_back(i);
  }
  std::sort(in.begin(), in.end(), [&](int x, int y) { return c[size_t(x)].micro_batch < c[size_t(y)].micro_batch; });
  return in;
}

Verdict judge(const std::vector<Contender>& c, const std::vector<int>& members, const ContestRules& rules) {
  Verdict v;
  // The reference: the best sum of log ratios against the other members, round by round.
  auto score = [&](int m) {
    double sum = 0;
    for (int t : members)
      if (t != m) sum += compare_offset(c[size_t(m)], c[size_t(t)]).log;
    return sum;
  };
  double best = -INFINITY;
  for (int m : members)
    if (const double s = score(m); v.reference < 0 || s > best) v.reference = m, best = s;
  if (v.reference < 0) return v;
  // Only ratios over two rounds or more decide: their scatter shows what drift does.
  const double floor = 1 - rules.knee;
  auto within = [&](int m) {
    for (int t : members) {
      const Ratio r = compare_offset(c[size_t(m)], c[size_t(t)]);
      if (t != m && (r.rounds < 2 || !(r.low(rules.z) >= floor))) return false;
    }
    return true;
  };
  auto out = [&](int m) {
    for (int t : members) {
      const Ratio r = compare_offset(c[size_t(m)], c[size_t(t)]);
      if (t != m && r.rounds >= 2 && r.high(rules.z) < floor) return true;
    }
    return false;
  };
  // members ascend by micro-batch: the first within the knee is the smallest.
  bool smaller_out = true;
  for (int m : members) {
    if (!rules.fastest && within(m)) {
      v.choice = m;
      v.settled = smaller_out;
      break;
    }
    smaller_out = smaller_out && out(m);
  }
  if (rules.fastest || v.choice < 0) {
    v.choice = v.reference;
    v.settled = rules.fastest && within(v.reference);
    v.unsure = !rules.fastest;
  }
  for (int m : members)
    if (m == v.choice || m == v.reference || !out(m)) v.members.push_back(m);
  if (v.unsure && rules.larger_when_unsure)
    for (int m : v.members)  // ascending: the last one not out
      if (!out(m)) v.choice = m;
  return v;
}

ContestOutcome run_contest(std::vector<Contender>& c, const ContestRules& rules,
                           const std::function<ProbeTiming(int, int)>& measure) {
  ContestOutcome o;
  o.verdict = judge(c, entrants(c, rules), rules);
  auto more = [&] {
    if (o.verdict.members.size() < 2 || o.rounds >= rules.max_rounds) return false;
    return !o.verdict.settled || o.rounds < rules.min_rounds;
  };
  int last = 0;  // rounds are numbered on from those already measured (a second contest)
  for (const Contender& x : c)
    for (const ProbeTiming& t : x.timings) last = std::max(last, t.round);
  while (more()) {
    ++o.rounds;
    std::vector<int> order = o.verdict.members;
    if ((last + o.rounds) % 2) std::reverse(order.begin(), order.end());  // the first pass ran ascending
    for (int i : order) {
      ProbeTiming t = measure(i, last + o.rounds);
      ++o.remeasured;
      t.round = last + o.rounds;
      if (t.samples_per_second > 0) c[size_t(i)].timings.push_back(t);
    }
    o.verdict = judge(c, o.verdict.members, rules);
  }
  return o;
}

}  // namespace sat
