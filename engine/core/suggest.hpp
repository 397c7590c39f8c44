#pragma once
// "Did you mean ...?" for names a user typed: the known name closest by edit distance, when it is close enough
// to be a typo (at most a third of the longer name's letters differ) -- so an error can name what was meant.
// Header-only and free of the engine: the `tandem` command (which links only the C ABI) uses it too.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Levenshtein distance, case-insensitive.
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The closest of `known` to `typed`, or "" when none is close (or `typed` is one of them).
inline std::string closest_name(std::string_view typed, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 0;
  for (const std::string& k : known) {
    const size_t d = edit_distance(typed, k);
    if (best.empty() || d < best_d) {
      best = k;
      best_d = d;
    }
  }
  const size_t longer = std::max(typed.size(), best.size());
  if (best.empty() || best_d == 0 || best_d * 3 > longer) return {};
  return best;
}

// " (did you mean 'x'?)" or "".
inline std::string did_you_mean(std::string_view typed, const std::vector<std::string>& known) {
  const std::string c = closest_name(typed, known);
  return c.empty() ? std::string() : " (did you mean '" + c + "'?)";
}

}  // namespace tandem
