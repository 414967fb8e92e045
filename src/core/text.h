// Text for reports: printf into a string, and escaping for HTML. Every report writer
// (tune.html, layout_tune.html, plan.html, report.html) uses these.
#pragma once
#include <string>

namespace sat {

// printf into a std::string, of any length.
__attribute__((format(printf, 1, 2))) std::string strf(const char* format, ...);

// s with & < > " ' replaced by entities: safe as HTML text and as an attribute value.
std::string html_escape(const std::string& s);

}  // namespace sat
