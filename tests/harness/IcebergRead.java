// Test harness: read an Iceberg table with Apache Iceberg's own Java library
// (IcebergGenerics, the reference implementation: equality and position
// deletes applied by Iceberg itself), as a second independent reader of
// what urutau's Iceberg sink wrote, beside DuckDB (iceberg_read.py).
//
//   java -cp LIB/*:CLASSES IcebergRead <metadata.json> [--order-by COL[,COL...]]
//   java -cp LIB/*:CLASSES IcebergRead <metadata.json> --digest
//
// Rows: one JSON object per row (keys = column names, table order), rendered
// as iceberg_read.py renders DuckDB's values, so the two readers' outputs
// compare equal: bool/int/long as JSON; float/double as JSON numbers (NaN and
// infinities as strings); decimal as an exact string ("1234.50"); date
// "YYYY-MM-DD"; time "HH:MM:SS.ffffff"; timestamp "YYYY-MM-DDTHH:MM:SS.ffffff";
// timestamptz the same in UTC with "+00:00"; uuid lower case; binary/fixed
// lower-case hex; struct an object; list an array; map {"keys", "values"}.
//
// --digest: one JSON object: "rows" (the count), "sum" (per integer or
// decimal column, its exact sum; decimals as strings) and "length" (per
// string column, the sum of its values' lengths in characters) - for a table
// too big to print.
//
// The table is loaded straight from its metadata file with a small local
// FileIO (no catalog, no Hadoop file system); `file:` prefixes are stripped.

import java.io.File;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.apache.iceberg.BaseTable;
import org.apache.iceberg.Files;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.Table;
import org.apache.iceberg.data.IcebergGenerics;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;

public class IcebergRead {
  /** Local files only: what the harness's warehouses are. */
  public static class LocalFileIO implements FileIO {
    private static String local(String path) {
      if (path.startsWith("file://")) {
        return path.substring("file://".length());
      }
      if (path.startsWith("file:")) {
        return path.substring("file:".length());
      }
      return path;
    }

    @Override
    public InputFile newInputFile(String path) {
      return Files.localInput(local(path));
    }

    @Override
    public OutputFile newOutputFile(String path) {
      return Files.localOutput(local(path));
    }

    @Override
    public void deleteFile(String path) {
      throw new UnsupportedOperationException("the reader deletes nothing: " + path);
    }
  }

  private static final DateTimeFormatter TIME = DateTimeFormatter.ofPattern("HH:mm:ss.SSSSSS");
  private static final DateTimeFormatter TIMESTAMP =
      DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm:ss.SSSSSS");

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: IcebergRead <metadata.json> [--order-by COL[,COL...]] [--digest]");
      System.exit(2);
    }
    String location = args[0];
    List<String> orderBy = new ArrayList<>();
    boolean digest = false;
    for (int i = 1; i < args.length; i++) {
      if (args[i].equals("--order-by") && i + 1 < args.length) {
        orderBy.addAll(Arrays.asList(args[++i].split(",")));
      } else if (args[i].equals("--digest")) {
        digest = true;
      } else {
        System.err.println("IcebergRead: unknown argument " + args[i]);
        System.exit(2);
      }
    }
    Table table = new BaseTable(new StaticTableOperations(location, new LocalFileIO()), location);
    List<Types.NestedField> columns = table.schema().columns();
    StringBuilder out = new StringBuilder();
    if (digest) {
      digest(table, columns, out);
    } else {
      List<Record> rows = new ArrayList<>();
      try (CloseableIterable<Record> read = IcebergGenerics.read(table).build()) {
        for (Record r : read) {
          rows.add(r.copy());
        }
      }
      if (!orderBy.isEmpty()) {
        Comparator<Record> by = null;
        for (String c : orderBy) {
          String name = c.trim();
          // A fixed column reads as byte[], and so does a uuid column in
          // a file written without Parquet's UUID annotation (iceberg-rust's
          // own writer, or urutau before it annotated): ordered as bytes.
          Comparator<Record> one =
              Comparator.comparing(
                  (Record r) -> {
                    Object v = r.getField(name);
                    return (Comparable) (v instanceof byte[] ? ByteBuffer.wrap((byte[]) v) : v);
                  },
                  Comparator.nullsLast(Comparator.naturalOrder()));
          by = by == null ? one : by.thenComparing(one);
        }
        rows.sort(by);
      }
      for (Record r : rows) {
        out.setLength(0);
        out.append('{');
        for (int i = 0; i < columns.size(); i++) {
          Types.NestedField f = columns.get(i);
          if (i > 0) {
            out.append(", ");
          }
          string(out, f.name());
          out.append(": ");
          value(out, f.type(), r.getField(f.name()));
        }
        out.append('}');
        System.out.println(out);
      }
      return;
    }
    System.out.println(out);
  }

  private static void digest(Table table, List<Types.NestedField> columns, StringBuilder out)
      throws Exception {
    long rows = 0;
    Map<String, Object> sums = new LinkedHashMap<>();
    Map<String, Long> lengths = new LinkedHashMap<>();
    for (Types.NestedField f : columns) {
      switch (f.type().typeId()) {
        case INTEGER:
        case LONG:
          sums.put(f.name(), BigInteger.ZERO);
          break;
        case DECIMAL:
          sums.put(f.name(), BigDecimal.ZERO.setScale(((Types.DecimalType) f.type()).scale()));
          break;
        case STRING:
          lengths.put(f.name(), 0L);
          break;
        default:
          break;
      }
    }
    try (CloseableIterable<Record> read = IcebergGenerics.read(table).build()) {
      for (Record r : read) {
        rows++;
        for (Map.Entry<String, Object> e : sums.entrySet()) {
          Object v = r.getField(e.getKey());
          if (v == null) {
            continue;
          }
          if (e.getValue() instanceof BigInteger) {
            e.setValue(((BigInteger) e.getValue()).add(BigInteger.valueOf(((Number) v).longValue())));
          } else {
            e.setValue(((BigDecimal) e.getValue()).add((BigDecimal) v));
          }
        }
        for (Map.Entry<String, Long> e : lengths.entrySet()) {
          Object v = r.getField(e.getKey());
          if (v != null) {
            CharSequence s = (CharSequence) v;
            e.setValue(e.getValue() + s.toString().codePointCount(0, s.length()));
          }
        }
      }
    }
    out.append("{\"rows\": ").append(rows).append(", \"sum\": {");
    boolean first = true;
    for (Map.Entry<String, Object> e : sums.entrySet()) {
      if (!first) {
        out.append(", ");
      }
      first = false;
      string(out, e.getKey());
      out.append(": ");
      if (e.getValue() instanceof BigDecimal) {
        string(out, ((BigDecimal) e.getValue()).toPlainString());
      } else {
        out.append(e.getValue());
      }
    }
    out.append("}, \"length\": {");
    first = true;
    for (Map.Entry<String, Long> e : lengths.entrySet()) {
      if (!first) {
        out.append(", ");
      }
      first = false;
      string(out, e.getKey());
      out.append(": ").append(e.getValue());
    }
    out.append("}}");
  }

  private static void value(StringBuilder out, Type type, Object v) {
    if (v == null) {
      out.append("null");
      return;
    }
    switch (type.typeId()) {
      case BOOLEAN:
      case INTEGER:
      case LONG:
        out.append(v);
        break;
      case FLOAT:
      case DOUBLE:
        double d = ((Number) v).doubleValue();
        if (Double.isNaN(d)) {
          string(out, "NaN");
        } else if (Double.isInfinite(d)) {
          string(out, d > 0 ? "Infinity" : "-Infinity");
        } else if (type.typeId() == Type.TypeID.FLOAT) {
          // As Python prints the float widened to a double.
          out.append(Double.toString((double) (float) d).replace("E", "e"));
        } else {
          out.append(Double.toString(d).replace("E", "e"));
        }
        break;
      case DECIMAL:
        string(out, ((BigDecimal) v).toPlainString());
        break;
      case STRING:
        string(out, v.toString());
        break;
      case DATE:
        string(out, ((LocalDate) v).toString());
        break;
      case TIME:
        string(out, ((LocalTime) v).format(TIME));
        break;
      case TIMESTAMP:
        if (v instanceof OffsetDateTime) {
          string(
              out,
              ((OffsetDateTime) v).withOffsetSameInstant(ZoneOffset.UTC).format(TIMESTAMP) + "+00:00");
        } else {
          string(out, ((LocalDateTime) v).format(TIMESTAMP));
        }
        break;
      case UUID:
        if (v instanceof UUID) {
          string(out, v.toString());
        } else {
          // The generic Parquet reader gives a uuid's 16 bytes.
          ByteBuffer b =
              v instanceof ByteBuffer ? ((ByteBuffer) v).duplicate() : ByteBuffer.wrap((byte[]) v);
          string(out, new UUID(b.getLong(), b.getLong()).toString());
        }
        break;
      case BINARY:
      case FIXED:
        byte[] bytes;
        if (v instanceof ByteBuffer) {
          ByteBuffer b = ((ByteBuffer) v).duplicate();
          bytes = new byte[b.remaining()];
          b.get(bytes);
        } else {
          bytes = (byte[]) v;
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : bytes) {
          hex.append(String.format("%02x", b));
        }
        string(out, hex.toString());
        break;
      case STRUCT:
        Record r = (Record) v;
        out.append('{');
        List<Types.NestedField> fields = type.asStructType().fields();
        for (int i = 0; i < fields.size(); i++) {
          if (i > 0) {
            out.append(", ");
          }
          string(out, fields.get(i).name());
          out.append(": ");
          value(out, fields.get(i).type(), r.getField(fields.get(i).name()));
        }
        out.append('}');
        break;
      case LIST:
        out.append('[');
        int i = 0;
        for (Object e : (List<?>) v) {
          if (i++ > 0) {
            out.append(", ");
          }
          value(out, type.asListType().elementType(), e);
        }
        out.append(']');
        break;
      case MAP:
        Map<?, ?> m = (Map<?, ?>) v;
        out.append("{\"keys\": [");
        int k = 0;
        for (Object key : m.keySet()) {
          if (k++ > 0) {
            out.append(", ");
          }
          value(out, type.asMapType().keyType(), key);
        }
        out.append("], \"values\": [");
        k = 0;
        for (Object val : m.values()) {
          if (k++ > 0) {
            out.append(", ");
          }
          value(out, type.asMapType().valueType(), val);
        }
        out.append("]}");
        break;
      default:
        string(out, v.toString());
    }
  }

  private static void string(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }
}
