<?xml version="1.0" encoding="UTF-8"?>
<!-- Navigation names read as a driver says them. A server given this file as its lexicon flag
     reads it for every stream, under the name "nav" (docs/api.md: Pronunciation lexicons).
     ChatTTS takes no phonemes: each lexeme needs an alias, the words said for its graphemes. -->
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"
         alphabet="ipa" xml:lang="en-US">
  <lexeme>
    <grapheme>I-95</grapheme>
    <grapheme>I 95</grapheme>
    <alias>Interstate ninety-five</alias>
  </lexeme>
  <lexeme>
    <grapheme>Zhongguancun St</grapheme>
    <alias>Jong gwan tsun Street</alias>
  </lexeme>
  <lexeme>
    <grapheme>中关村</grapheme>
    <alias>中关村科技园</alias>
  </lexeme>
  <lexeme>
    <grapheme>SFO</grapheme>
    <phoneme>ˌɛs ɛf ˈoʊ</phoneme>
    <alias>San Francisco International</alias>
  </lexeme>
</lexicon>
