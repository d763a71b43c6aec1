from PKG.text import is_palindrome, title_case, truncate, word_count


def test_word_count():
    assert word_count("the quick  brown fox") == 4
    assert word_count("  leading and trailing  ") == 3
    assert word_count("") == 0


def test_palindrome_true():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("abba")


def test_palindrome_false():
    assert not is_palindrome("abca")
    assert not is_palindrome("ab")


def test_truncate_short():
    assert truncate("hello", 5) == "hello"


def test_truncate_long():
    assert truncate("hello world", 8) == "hello..."
    assert len(truncate("abcdefghij", 6)) == 6


def test_title_case():
    assert title_case("hello wORLD") == "Hello World"
    assert title_case("a") == "A"
