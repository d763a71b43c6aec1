"""Small text utilities."""


def word_count(text):
    count = 0
    in_word = False
    for ch in text:
        if ch.isspace():
            in_word = False
        elif not in_word:
            in_word = True
            count += 1
    return count


def is_palindrome(text):
    letters = [c.lower() for c in text if c.isalnum()]
    i = 0
    j = len(letters) - 1
    while i < j:
        if letters[i] != letters[j]:
            return False
        i += 1
        j -= 1
    return True


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def title_case(text):
    return " ".join(word[:1].upper() + word[1:].lower() for word in text.split(" "))
