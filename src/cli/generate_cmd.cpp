#include "cli/generate_cmd.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "backend/cpu/blas.h"
#include "cli/args.h"
#include "core/error.h"
#include "core/io.h"
#include "infer/generate.h"

namespace sat::cli {

CLI::App* add_generate_command(CLI::App& app, GenerateArgs& a) {
  auto* c = app.add_subcommand("generate", "text from a trained language model (gpt:, llama:): the prompt and what "
                               "the model writes after it, through its tokenizer, with a KV cache");
  c->add_option("--model", a.model, "the language model the weights are of (gpt:... or llama:..., as given to train)")
      ->required();
  c->add_option("--init-weights", a.init_weights, "the trained weights: a safetensors file (train --save-weights) or a "
                "checkpoint directory")->required();
  c->add_option("--prompt", a.prompt, "the text the model goes on from (after the tokenizer's <s>, as each training "
                "document began; \"\": from <s> alone)")->required();
  c->add_option("--tokenizer", a.tokenizer, "a SentencePiece FILE.model (default: the tokenizer.model beside the "
                "shards the weights were trained on, which they record)");
  c->add_option("--max-new-tokens", a.max_new_tokens, "tokens to write at most")->capture_default_str();
  c->add_option("--temperature", a.temperature, "the logits are divided by it before sampling; 0: greedy (the most "
                "likely token every time)")->capture_default_str();
  c->add_option("--top-k", a.top_k, "sample among the k most likely tokens only (0: all)")->capture_default_str();
  c->add_option("--top-p", a.top_p, "nucleus sampling: among the most likely tokens whose probabilities add up to p "
                "(1: all)")->capture_default_str();
  c->add_option("--seed", a.seed, "the draws' seed: the same seed, weights and prompt give the same text")
      ->capture_default_str();
  c->add_flag("--no-cache", a.no_cache, "run the model's whole forward over the prefix for every token instead of "
              "keeping each layer's keys and values (the reference the cache is tested against; slower)");
  c->add_option("--vocab", a.vocab, "GPT presets: train's --vocab");
  c->add_option("--threads", a.threads, "CPU threads (0: the cores this process may use)")->capture_default_str();
  return c;
}

namespace {

const char* stop_words(StopReason r) {
  switch (r) {
    case StopReason::max_new_tokens: return "--max-new-tokens";
    case StopReason::stop_token: return "the end of the text (the tokenizer's </s> or a new document's <s>)";
    case StopReason::context: return "the model's context";
  }
  return "";
}

}  // namespace

int run_generate(const GenerateArgs& a) {
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (the cores this process may use) or a positive number, got ", a.threads);
  cpu::set_num_threads(a.threads);
  GenerateOptions o;
  o.sampling = Sampling{a.temperature, a.top_k, a.top_p};
  o.max_new_tokens = a.max_new_tokens;
  o.seed = a.seed;
  check_sampling(o.sampling);
  SAT_CHECK(o.max_new_tokens >= 0, "--max-new-tokens: expected 0 or more tokens, got ", o.max_new_tokens);
  check_input_path("--init-weights", a.init_weights, true);
  const ModelConfig mc = model_for(a.model, a.vocab, 0);
  SAT_CHECK(mc.tokens, "--model ", mc.name, ": not a language model; generate writes text with gpt:... or llama:... "
            "models (such as gpt-mini)");
  SAT_CHECK(mc.family == ModelFamily::gpt || mc.family == ModelFamily::llama, "--model ", mc.name, ": generate "
            "runs the gpt and llama families");
  // The cheap checks first: the tokenizer and the prompt, then the weights.
  const Tokenizer tok = language_model_tokenizer(a.tokenizer, a.init_weights, mc.vocab);
  const std::vector<int32_t> prompt = prompt_tokens(tok, a.prompt, mc.context);
  LanguageModel lm = load_language_model(mc, a.init_weights);
  const std::unique_ptr<Decoder> d = a.no_cache ? make_full_decoder(mc, *lm.params) : make_cached_decoder(mc, *lm.params);
  for (int32_t id : {tok.eos_id(), tok.bos_id()})
    if (id >= 0) o.stop.push_back(id);
  std::fprintf(stderr, "saturate generate: %s (%s), tokenizer %s; %zu prompt tokens, %s; temperature %g, top-k %lld, "
               "top-p %g, seed %llu\n", mc.name.c_str(), a.init_weights.c_str(), tok.name().c_str(), prompt.size(),
               a.no_cache ? "no cache (the whole prefix's forward for every token)" : "KV cache", a.temperature,
               static_cast<long long>(a.top_k), a.top_p, static_cast<unsigned long long>(a.seed));
  TextStream text(tok, prompt, [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  });
  const GenerateResult r = generate(*d, prompt, o, [&](int32_t t) { text.add(t); });
  text.finish();
  std::printf("\n");
  std::fflush(stdout);
  const double per_token = r.decode_steps > 0 ? 1e3 * r.decode_seconds / double(r.decode_steps) : 0;
  std::fprintf(stderr, "generated %zu tokens (the prompt's %zu in %.3f s, then %.2f ms a token); stopped at %s",
               r.tokens.size(), prompt.size(), r.prompt_seconds, per_token, stop_words(r.reason));
  if (r.reason == StopReason::context)
    std::fprintf(stderr, " (%lld tokens)", static_cast<long long>(mc.context));
  if (r.reason == StopReason::max_new_tokens)
    std::fprintf(stderr, " (%lld)", static_cast<long long>(a.max_new_tokens));
  std::fprintf(stderr, "\n");
  return 0;
}

}  // namespace sat::cli
