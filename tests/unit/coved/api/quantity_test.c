#include "coved/api/quantity.h"
#include "check.h"

int main(void)
{
    CHECK_EQ_INT(quantity_parse_millicores("500m"), 500);
    CHECK_EQ_INT(quantity_parse_millicores("2"), 2000);
    CHECK_EQ_INT(quantity_parse_millicores("0.5"), 500);
    CHECK_EQ_INT(quantity_parse_millicores("1.25"), 1250);
    CHECK_EQ_INT(quantity_parse_millicores("0"), -1);
    CHECK_EQ_INT(quantity_parse_millicores("-1"), -1);
    CHECK_EQ_INT(quantity_parse_millicores(""), -1);
    CHECK_EQ_INT(quantity_parse_millicores("m"), -1);
    CHECK_EQ_INT(quantity_parse_millicores("1.5m"), -1);
    CHECK_EQ_INT(quantity_parse_millicores("abc"), -1);
    CHECK_EQ_INT(quantity_parse_millicores("99999999999999999999999"), -1);

    CHECK_EQ_INT(quantity_parse_bytes("512Mi"), 512LL << 20);
    CHECK_EQ_INT(quantity_parse_bytes("1Gi"), 1LL << 30);
    CHECK_EQ_INT(quantity_parse_bytes("1.5Gi"), 3LL << 29);
    CHECK_EQ_INT(quantity_parse_bytes("1G"), 1000000000LL);
    CHECK_EQ_INT(quantity_parse_bytes("100k"), 100000);
    CHECK_EQ_INT(quantity_parse_bytes("4096"), 4096);
    CHECK_EQ_INT(quantity_parse_bytes("0"), -1);
    CHECK_EQ_INT(quantity_parse_bytes("-5Mi"), -1);
    CHECK_EQ_INT(quantity_parse_bytes("5 Mi"), -1);
    CHECK_EQ_INT(quantity_parse_bytes("5Xi"), -1);
    CHECK_EQ_INT(quantity_parse_bytes("9999999999Ti"), -1);
    CHECK_EQ_INT(quantity_parse_bytes("Mi"), -1);

    CHECK_EQ_INT(quantity_parse_count("256"), 256);
    CHECK_EQ_INT(quantity_parse_count("0"), -1);
    CHECK_EQ_INT(quantity_parse_count("12a"), -1);
    CHECK_EQ_INT(quantity_parse_count(""), -1);
    return CHECK_DONE();
}
