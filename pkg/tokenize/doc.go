// Package tokenize turns OpenAI request bodies into token ids and prefix-cache
// block hashes without a model tokenizer.
//
// The endpoint picker and the model-server simulator both use it, so the
// block hashes the picker predicts are the ones the simulator caches.
//
// # Token estimate
//
// Real tokenizers need the model's vocabulary, which the picker does not have
// on the request path. Tokenize approximates a byte-pair tokenizer by cutting
// text at character-class boundaries: a run of letters (ASCII letters and any
// non-ASCII byte) becomes pieces of at most 5 bytes, a run of digits pieces
// of at most 3, a run of punctuation pieces of at most 4, and a run of
// whitespace pieces of at most 4. A single space joins the piece that follows
// it, as " the" is one token in GPT-style vocabularies. A piece's id is a
// stable 64-bit hash of its bytes truncated to uint32. English prose comes
// out at about 4 characters per token, within roughly 25% of common
// vocabularies; code and non-Latin scripts deviate more. Token-id prompts
// (`"prompt": [1000, 1001]`) are taken as they are, so their counts are exact.
//
// # Request bodies
//
// Extract reads a /v1/completions body (`prompt` as a string, an array of
// strings, an array of token ids or an array of such arrays, all
// concatenated) or a /v1/chat/completions body (`messages`, each content a
// string or an array of `{"type":"text","text":...}` parts) in a single pass
// over the bytes, validating the JSON as it goes and tokenizing string
// contents in place, without building a document tree. Chat messages add
// marker tokens around each message and its role, and a final assistant
// marker, as a chat template does, so structure counts toward the length.
// The same pass reads what the endpoint picker needs besides the prompt
// (Fields): the model, nvext.agent_hints, and the byte spans of the
// top-level priority members, so the picker never scans a body twice. Keys
// match exactly, as the OpenAI API reads them, and the last of duplicates
// wins, as in encoding/json. ExtractPrompt is Extract without the fields.
//
// Long prompts are the common case, so string contents are tokenized 64
// bytes at a time wherever a piece starts with 64 plain bytes (no quote,
// backslash or control character) ahead: the block is classified into
// bitmasks a word at a time, every piece start in it follows from bit
// operations, and the pieces are read off the start mask. The rest (short
// strings, the bytes around escapes) goes a byte at a time. Both give the
// ids Tokenize gives for the decoded text; the fuzz targets hold them to it.
//
// # Block hashes
//
// BlockHashes chains one hash per full block of blockSize tokens: hash i
// covers hash i-1 and the tokens of block i, as vLLM's automatic prefix
// caching does, so equal hashes at position i mean equal prefixes through
// block i. A partial last block has no hash, because engines only cache full
// blocks. A block's content is hashed in four independent lanes and only
// one mix per block is chained, so hashing runs at the multiplier's
// throughput rather than its latency.
package tokenize
